#!/usr/bin/env python3
"""store_attack.py: hostile clients against a ddprun store, for the sanitizer run.

    store_attack.py HOST PORT TOKEN|- [--seconds S] [--seed N]

Drives a running store (ddp-rendezvous, built with ASan/UBSan by scripts/sanitize)
through what a careless or hostile client does: garbage bytes, frames with random
types, sizes and bodies before and after authentication, mutated well-formed
requests, frames cut off halfway (large declared bodies), slowloris senders,
floods of idle connections dropped with a reset, blocked requests and wills left
behind by a dropped connection, a client that never reads its replies, and
connect/close churn. Every phase is bounded in count and time, and only loopback
addresses are accepted. At the end a well-behaved client must still set and get a
key. Exits 0 when the store answered throughout, 1 (with one line saying what
failed) otherwise; memory errors show up in the store's sanitizer reports.
"""
import argparse
import ipaddress
import os
import random
import socket
import struct
import sys
import threading
import time

from store_wire import (ADD, APPEND, CHECK, COMPARE_SET, DELETE, GET, GOODBYE, HEADER, HELLO, MAGIC, MULTI_GET,
                        MULTI_SET, NONCE, NUM_KEYS, OK, PING, SET, SET_WILL, WAIT, Conn, Failure, connect, field,
                        frame, i64, keys, u32)


def authed(addr, token, ns=b"attack"):
    try:
        return connect(addr, token, ns)
    except Failure:
        raise Failure("a client with the right token was refused") from None


def valid_bodies(rng):
    """One well-formed body per request type, with random keys and values."""
    k = lambda: rng.randbytes(rng.randint(1, 64))
    v = lambda: rng.randbytes(rng.randint(0, 2048))
    return [
        (SET, field(k()) + field(v())),
        (GET, field(k()) + i64(rng.randint(0, 50))),
        (ADD, field(k()) + i64(rng.randint(-5, 5))),
        (COMPARE_SET, field(k()) + field(v()) + field(v())),
        (WAIT, keys([k() for _ in range(rng.randint(1, 8))]) + i64(rng.randint(0, 50))),
        (CHECK, keys([k() for _ in range(rng.randint(1, 8))])),
        (DELETE, field(k())),
        (NUM_KEYS, b""),
        (MULTI_GET, keys([k() for _ in range(rng.randint(1, 8))]) + i64(rng.randint(0, 50))),
        (MULTI_SET, u32(2) + field(k()) + field(v()) + field(k()) + field(v())),
        (APPEND, field(k()) + field(v())),
        (SET_WILL, field(k()) + field(v()) + i64(0)),
        (PING, b""),
    ]


# --- The phases: each takes (addr, token, rng) and stays within its own bounds. ---

def garbage(addr, token, rng):
    """Random bytes, and frames with random types, sizes and bodies, with and without HELLO."""
    for i in range(60):
        c = Conn(addr)
        if i % 2 and c.hello(token, b"attack") != OK:
            raise Failure("handshake refused")
        if i % 3 == 0:
            c.send(rng.randbytes(rng.randint(1, 4096)))
        else:
            body = rng.randbytes(rng.randint(0, 2048))
            size = len(body) if i % 5 else rng.choice([0xFFFFFFFF, 1 << 30, len(body) + 7])
            c.send(HEADER.pack(MAGIC, rng.choice([0, 1, 2]), rng.randint(0, 255), 0, i, size) + body)
        c.drain(0.3)
        c.close()


def mutated(addr, token, rng):
    """Well-formed requests of every type with a few bytes flipped or cut off."""
    for i in range(150):
        c = authed(addr, token)
        kind, body = rng.choice(valid_bodies(rng))
        data = bytearray(frame(kind, 7, body))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(HEADER.size - 4, len(data))] = rng.randrange(256)
        if i % 4 == 0:
            data = data[:rng.randint(HEADER.size, len(data))]
        c.send(bytes(data))
        c.drain(0.05)
        c.reset() if i % 2 else c.close()


def well_formed(addr, token, rng):
    """Every request type, valid, many times over: the store's normal paths under ASan."""
    c = authed(addr, token, b"busy")
    for _ in range(40):
        for kind, body in valid_bodies(rng):
            if c.request(kind, body) is None:
                raise Failure("the store closed a connection that sent only valid requests")
    c.request(GOODBYE, b"")
    c.close()


def half_frames(addr, token, rng):
    """Declared bodies up to 16 MiB of which a few hundred bytes arrive, then a drop."""
    conns = []
    for i in range(20):
        c = authed(addr, token) if i % 4 else Conn(addr)
        declared = rng.choice([1 << 20, 16 << 20, 4096])
        c.send(HEADER.pack(MAGIC, 1, SET, 0, 9, declared) + rng.randbytes(300))
        conns.append(c)
    time.sleep(0.5)
    for i, c in enumerate(conns):
        c.reset() if i % 2 else c.close()


def slowloris(addr, token, rng):
    """Connections that send a HELLO one byte every 50 ms, some giving up halfway."""
    conns = [Conn(addr) for _ in range(30)]
    payload = frame(HELLO, 1, field(b"slow") + field(os.urandom(NONCE)) + field(b""))
    for step in range(40):  # 2 s
        for i, c in enumerate(conns):
            if c and not (i % 3 == 0 and step > 20):
                c.send(payload[step:step + 1])
            elif c:
                c.reset()
                conns[i] = None
        time.sleep(0.05)
    for c in conns:
        if c:
            c.close()


def idle_flood(addr, token, rng):
    """Hundreds of idle connections, half authenticated, then all reset at once."""
    conns = [authed(addr, token) if i % 2 else Conn(addr) for i in range(300)]
    time.sleep(0.3)
    for c in conns:
        c.reset()


def dropped_waiters(addr, token, rng):
    """Blocked GETs, WAITs on many keys and wills, left behind by a reset."""
    for i in range(20):
        c = authed(addr, token, b"waiters")
        batch = b""
        for j in range(100):
            batch += frame(GET, 100 + j, field(b"never-%d" % j) + i64(60000))
        batch += frame(WAIT, 999, keys([b"k%d" % j for j in range(2000)]) + i64(60000))
        batch += frame(SET_WILL, 1000, field(b"failure") + field(b"attack %d" % i) + i64(0))
        c.send(batch)
        time.sleep(0.02)
        c.reset()


def never_reads(addr, token, rng):
    """A client that pipelines GETs of a 64 KiB value and never reads the answers."""
    c = authed(addr, token, b"reader")
    if c.request(SET, field(b"big") + field(b"x" * 65536))[0] != OK:
        raise Failure("SET of 64 KiB refused")
    c.sock.setblocking(False)
    batch = b"".join(frame(GET, 10 + j, field(b"big") + i64(0)) for j in range(400))
    try:
        c.sock.send(batch)
    except OSError:
        pass
    time.sleep(0.5)
    c.reset()


def churn(addr, token, rng):
    """Connect and close at once, 500 times."""
    for i in range(500):
        s = socket.create_connection(addr, timeout=5)
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


PHASES = [garbage, mutated, well_formed, half_frames, slowloris, idle_flood, dropped_waiters, never_reads, churn]


def main():
    p = argparse.ArgumentParser(description="Hostile clients against a ddprun store on loopback.")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("token", help="the store's token, or - for none")
    p.add_argument("--seconds", type=float, default=60, help="give up (and fail) after this long")
    p.add_argument("--seed", type=int, default=17)
    a = p.parse_args()
    if not ipaddress.ip_address(a.host).is_loopback:
        sys.exit("store_attack: only loopback addresses (127.0.0.0/8, ::1) are attacked")
    addr = (a.host, a.port)
    token = b"" if a.token == "-" else a.token.encode()

    errors = []

    def run(phase, seed):
        try:
            start = time.monotonic()
            phase(addr, token, random.Random(seed))
            if os.environ.get("STORE_ATTACK_VERBOSE"):
                print(f"{phase.__name__}: {time.monotonic() - start:.1f} s")
        except (Failure, OSError) as e:
            errors.append(f"{phase.__name__}: {e}")

    # Two rounds; in each, every phase runs on its own thread at once.
    deadline = time.monotonic() + a.seconds
    for round_ in range(2):
        threads = [threading.Thread(target=run, args=(ph, a.seed * 100 + round_ * 10 + i), daemon=True)
                   for i, ph in enumerate(PHASES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            errors.append("phases still running after %.0f s" % a.seconds)
            break
    try:
        c = authed(addr, token, b"after")
        c.request(SET, field(b"k") + field(b"still here"))
        got = c.request(GET, field(b"k") + i64(1000))
        if got is None or got[0] != OK or got[2] != field(b"still here"):
            errors.append("after the attack, a well-behaved client could not read back its key")
        c.request(GOODBYE, b"")
        c.close()
    except (Failure, OSError) as e:
        errors.append(f"after the attack: {e}")
    if errors:
        print("store_attack: " + "; ".join(errors))
        return 1
    print(f"store_attack: {len(PHASES)} kinds of hostile client, 2 rounds: the store answered throughout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
