"""The benchmark behind scripts/bench/store_attack (see there)."""
import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
DAEMON = os.path.join(BUILD, "rendezvous", "ddp-rendezvous")

MAGIC, VERSION = 0x52504444, 1
HELLO, SET, GET, ADD, WAIT, OK = 2, 10, 11, 12, 14, 64


def frame(ftype, rid, body=b"", declared=None):
    size = len(body) if declared is None else declared
    return struct.pack("<IBBHII", MAGIC, VERSION, ftype, 0, rid, size) + body


def field(b):
    return struct.pack("<I", len(b)) + b


def read_frame(sock):
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            data += chunk
        return data
    _, _, ftype, _, rid, size = struct.unpack("<IBBHII", exactly(16))
    return ftype, rid, exactly(size)


def connect(port, ns, timeout=10.0):
    """A connection authenticated into namespace `ns` (the daemon runs without a token)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    read_frame(s)  # CHALLENGE
    s.sendall(frame(HELLO, 1, field(ns.encode()) + field(b"n" * 32) + field(b"")))
    ftype, _, body = read_frame(s)
    if ftype != OK:
        raise RuntimeError("HELLO refused: " + body[4:].decode(errors="replace"))
    return s


def call(sock, ftype, rid, body):
    sock.sendall(frame(ftype, rid, body))
    rtype, _, rbody = read_frame(sock)
    if rtype != OK:
        raise RuntimeError(f"request {ftype} failed: " + rbody[4:].decode(errors="replace"))
    return rbody


def rendezvous(port, ns):
    """Two nodes: connect, authenticate, node 0 sets the NCCL id, both add(arrived) and get it. Seconds."""
    start = time.perf_counter()
    node0, node1 = connect(port, ns), connect(port, ns)
    call(node0, SET, 2, field(b"nccl_id") + field(b"\x42" * 128))
    for i, node in enumerate((node0, node1)):
        call(node, ADD, 3, field(b"arrived") + struct.pack("<q", 1))
        if len(call(node, GET, 4, field(b"nccl_id") + struct.pack("<q", 10000))) != 4 + 128:
            raise RuntimeError("wrong nccl_id")
    elapsed = time.perf_counter() - start
    node0.close()
    node1.close()
    return elapsed


def status_kib(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(name + " not found")


def start_daemon(limit_mib):
    env = {k: v for k, v in os.environ.items() if k != "DDPRUN_TOKEN"}
    proc = subprocess.Popen([DAEMON, "--host", "127.0.0.1", "--port", "0", "--max_memory_mib", str(limit_mib)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    m = re.search(r":(\d+) ", proc.stdout.readline())
    if not m:
        sys.exit("store_attack bench: the daemon did not start: " + proc.stderr.read())
    return proc, int(m.group(1))


def attack_half_sent_sets(port):
    socks = []
    for _ in range(20):
        s = connect(port, "attack")
        s.sendall(frame(SET, 2, b"x" * 300, declared=16 << 20))
        socks.append(s)
    return socks


def attack_big_waits(port):
    body = struct.pack("<I", 65536) + b"".join(field(b"key-%d" % k) for k in range(65536)) + struct.pack("<q", 60000)
    socks = []
    for _ in range(20):
        s = connect(port, "attack")
        s.sendall(frame(WAIT, 2, body))
        socks.append(s)
    return socks


def attack_unread_gets(port):
    owner = connect(port, "attack")
    call(owner, SET, 2, field(b"big") + field(b"b" * (900 << 10)))
    gets = b"".join(frame(GET, 10 + i, field(b"big") + struct.pack("<q", 1000)) for i in range(200))
    socks = [owner]
    for _ in range(10):
        s = connect(port, "attack")
        s.setblocking(False)
        try:
            s.send(gets)  # what the daemon does not read stays in our buffer
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


ATTACKS = [
    ("20 x half-sent 16 MiB SET", attack_half_sent_sets),
    ("20 x 65,536-key WAIT", attack_big_waits),
    ("10 x unread 900 KB GETs", attack_unread_gets),
]


def run_attack(attack, limit_mib, rounds):
    daemon, port = start_daemon(limit_mib)
    peak_sampled = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak_sampled[0] = max(peak_sampled[0], status_kib(daemon.pid, "VmRSS"))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        socks = attack(port)
        time.sleep(0.5)  # let the daemon take in what it will
        times = [rendezvous(port, f"job-{i}") for i in range(rounds)]
        alive = daemon.poll() is None
        hwm = status_kib(daemon.pid, "VmHWM") if alive else -1
        for s in socks:
            s.close()
        after = rendezvous(port, "job-after")
        return alive, hwm / 1024, times, after
    finally:
        stop.set()
        sampler.join()
        daemon.terminate()
        daemon.wait(timeout=10)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="fresh daemons per attack")
    parser.add_argument("--rounds", type=int, default=10, help="rendezvous during each attack")
    parser.add_argument("--limit-mib", type=int, default=64)
    args = parser.parse_args()
    if not os.path.exists(DAEMON):
        sys.exit(f"store_attack bench: {DAEMON} not built (run scripts/setup)")
    print(f"ddp-rendezvous --max_memory_mib {args.limit_mib} ({DAEMON}); medians of {args.repeats} daemons, "
          f"{args.rounds} rendezvous each")
    print(f"{'attack':<28} {'up':>3} {'peak RSS MiB':>13} {'limit+32':>9} {'rdzv median ms':>15} "
          f"{'rdzv max ms':>12} {'after ms':>9}")
    for name, attack in ATTACKS:
        runs = []
        for _ in range(args.repeats):
            try:
                runs.append(run_attack(attack, args.limit_mib, args.rounds))
            except (OSError, RuntimeError) as e:  # the daemon died or stopped answering
                runs.append((False, -1, [float("nan")], float("nan")))
                print(f"  ({name}: {e})")
        up = all(r[0] for r in runs)
        peak = statistics.median(r[1] for r in runs)
        med = statistics.median(statistics.median(r[2]) for r in runs) * 1000
        worst = max(max(r[2]) for r in runs) * 1000
        after = statistics.median(r[3] for r in runs) * 1000
        print(f"{name:<28} {'yes' if up else 'NO':>3} {peak:>13.1f} {args.limit_mib + 32:>9} {med:>15.2f} "
              f"{worst:>12.2f} {after:>9.2f}")
    print("targets: peak RSS <= limit + 32 MiB; rendezvous <= 100 ms")


if __name__ == "__main__":
    main()
