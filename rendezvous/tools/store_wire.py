"""The ddprun store's wire format in Python (version 1, rendezvous/PROTOCOL.md): frames,
body fields, the handshake, and a connection that reads whole frames.

The one Python writer of the format: rendezvous/tools/store_attack.py (hostile clients
for the sanitizer run) and scripts/bench/store_attack_bench.py use it. The C++ client
is the store itself (rdzv::TcpStore); tests/rendezvous/raw_client.hpp writes raw frames
for the C++ tests.
"""
import hashlib
import hmac
import os
import socket
import struct
import time

MAGIC, VERSION = 0x52504444, 1
HEADER = struct.Struct("<IBBHII")  # magic, version, type, reserved, request id, body size
CHALLENGE, HELLO = 1, 2
SET, GET, ADD, COMPARE_SET, WAIT, CHECK, DELETE = 10, 11, 12, 13, 14, 15, 16
NUM_KEYS, MULTI_GET, MULTI_SET, APPEND, SET_WILL, GOODBYE, PING, SET_WILLS = 17, 18, 19, 20, 21, 22, 23, 24
OK, ERROR, TIMEOUT = 64, 65, 66
NONCE = 32  # bytes of each side's nonce


class Failure(Exception):
    """The store answered something a client cannot go on from."""


def u32(n):
    return struct.pack("<I", n)


def i64(n):
    return struct.pack("<q", n)


def field(b):
    """A `bytes` field: its u32 length, then the bytes."""
    return u32(len(b)) + b


def keys(ks):
    """A key list: a u32 count, then each key as a field."""
    return u32(len(ks)) + b"".join(field(k) for k in ks)


def frame(kind, rid, body, version=VERSION, declared=None):
    """A frame of type `kind` with request id `rid`; `declared` claims another body size
    than the body's (a frame cut off halfway)."""
    size = len(body) if declared is None else declared
    return HEADER.pack(MAGIC, version, kind, 0, rid, size) + body


def client_proof(token, server_nonce, client_nonce, namespace):
    """HELLO's proof: empty without a token."""
    if not token:
        return b""
    return hmac.new(token, b"ddprun-store-v1 client|" + server_nonce + client_nonce + namespace,
                    hashlib.sha256).digest()


def message(body):
    """The text of an ERROR or TIMEOUT reply."""
    (size,) = struct.unpack_from("<I", body) if len(body) >= 4 else (0,)
    return body[4:4 + size].decode(errors="replace")


class Conn:
    """One TCP connection to the store (TCP_NODELAY), with a deadline of `timeout`
    seconds on every read."""

    def __init__(self, addr, timeout=5.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.rid = 1

    def send(self, data):
        """False when the store closed the connection first (fine for a hostile client)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def read_frame(self):
        """(type, request id, body) of the next frame; None when the store closed."""
        while True:
            if len(self.buf) >= HEADER.size:
                magic, _, kind, _, rid, size = HEADER.unpack_from(self.buf)
                if magic != MAGIC:
                    raise Failure("the store sent a frame with a bad magic")
                if len(self.buf) >= HEADER.size + size:
                    body = self.buf[HEADER.size:HEADER.size + size]
                    self.buf = self.buf[HEADER.size + size:]
                    return kind, rid, body
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def request(self, kind, body):
        """Sends one request and returns the next frame (the reply of a client that keeps
        one request in flight), None when the store closed."""
        self.rid += 1
        self.send(frame(kind, self.rid, body))
        return self.read_frame()

    def call(self, kind, body):
        """A request that must succeed: the OK reply's body; raises Failure otherwise."""
        reply = self.request(kind, body)
        if reply is None:
            raise Failure(f"the store closed the connection on request type {kind}")
        if reply[0] != OK:
            raise Failure(f"request type {kind} failed: {message(reply[2])}")
        return reply[2]

    def hello(self, token=b"", namespace=b""):
        """Completes the handshake; returns the HELLO reply's type (OK when admitted).
        The HELLO frame's magic goes out before the CHALLENGE is read, as ddprun's client
        does: a store that admits torch clients greets a connection only after its first bytes."""
        self.send(u32(MAGIC))
        got = self.read_frame()
        if got is None or got[0] != CHALLENGE:
            raise Failure("no CHALLENGE from the store")
        server_nonce = got[2][4:4 + NONCE]
        client_nonce = os.urandom(NONCE)
        self.rid += 1
        self.send(frame(HELLO, self.rid, field(namespace) + field(client_nonce) +
                        field(client_proof(token, server_nonce, client_nonce, namespace)))[4:])
        reply = self.read_frame()
        return reply[0] if reply else None

    def drain(self, limit=5.0):
        """Reads until the store closes the connection (True) or `limit` seconds pass."""
        end = time.monotonic() + limit
        try:
            while time.monotonic() < end:
                self.sock.settimeout(max(0.01, end - time.monotonic()))
                if not self.sock.recv(65536):
                    return True
        except socket.timeout:
            return False
        except OSError:
            return True
        return False

    def reset(self):
        """Drops the connection with a TCP reset, as a crashed client would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self):
        self.sock.close()


def connect(addr, token=b"", namespace=b"", timeout=5.0):
    """A connection admitted into `namespace`; raises Failure when the store refuses it."""
    c = Conn(addr, timeout)
    if c.hello(token, namespace) != OK:
        c.close()
        raise Failure("the store refused the HELLO")
    return c
