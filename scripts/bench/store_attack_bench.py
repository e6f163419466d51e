"""The benchmark behind scripts/bench/store_attack (see there)."""
import argparse
import os
import struct
import sys
import time

from harness import paths
from harness.procs import Daemon, status_kib
from harness.runs import median

sys.path.insert(0, os.path.join(paths.ROOT, "rendezvous", "tools"))
from store_wire import ADD, GET, SET, WAIT, Failure, connect as wire_connect, field, frame  # noqa: E402


def connect(port, ns, timeout=10.0):
    """A connection admitted into namespace `ns` (the daemon runs without a token)."""
    return wire_connect(("127.0.0.1", port), namespace=ns.encode(), timeout=timeout)


def rendezvous(port, ns):
    """Two nodes: connect, authenticate, node 0 sets the NCCL id, both add(arrived) and get it. Seconds."""
    start = time.perf_counter()
    node0, node1 = connect(port, ns), connect(port, ns)
    node0.call(SET, field(b"nccl_id") + field(b"\x42" * 128))
    for i, node in enumerate((node0, node1)):
        node.call(ADD, field(b"arrived") + struct.pack("<q", 1))
        if len(node.call(GET, field(b"nccl_id") + struct.pack("<q", 10000))) != 4 + 128:
            raise Failure("wrong nccl_id")
    elapsed = time.perf_counter() - start
    node0.close()
    node1.close()
    return elapsed


def start_daemon(limit_mib):
    env = {k: v for k, v in os.environ.items() if k != "DDPRUN_TOKEN"}
    return Daemon(["--host", "127.0.0.1", "--port", "0", "--max_memory_mib", str(limit_mib)], env)


def attack_half_sent_sets(port):
    socks = []
    for _ in range(20):
        s = connect(port, "attack")
        s.sock.sendall(frame(SET, 2, b"x" * 300, declared=16 << 20))
        socks.append(s)
    return socks


def attack_big_waits(port):
    body = struct.pack("<I", 65536) + b"".join(field(b"key-%d" % k) for k in range(65536)) + struct.pack("<q", 60000)
    socks = []
    for _ in range(20):
        s = connect(port, "attack")
        s.sock.sendall(frame(WAIT, 2, body))
        socks.append(s)
    return socks


def attack_unread_gets(port):
    owner = connect(port, "attack")
    owner.call(SET, field(b"big") + field(b"b" * (900 << 10)))
    gets = b"".join(frame(GET, 10 + i, field(b"big") + struct.pack("<q", 1000)) for i in range(200))
    socks = [owner]
    for _ in range(10):
        s = connect(port, "attack")
        s.sock.setblocking(False)
        try:
            s.sock.send(gets)  # what the daemon does not read stays in our buffer
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
    with start_daemon(limit_mib) as daemon:
        socks = attack(daemon.port)
        time.sleep(0.5)  # let the daemon take in what it will
        times = [rendezvous(daemon.port, f"job-{i}") for i in range(rounds)]
        alive = daemon.proc.poll() is None
        hwm = status_kib(daemon.pid, "VmHWM") if alive else -1
        for s in socks:
            s.close()
        after = rendezvous(daemon.port, "job-after")
        return alive, hwm / 1024, times, after


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="fresh daemons per attack")
    parser.add_argument("--rounds", type=int, default=10, help="rendezvous during each attack")
    parser.add_argument("--limit-mib", type=int, default=64)
    args = parser.parse_args()
    paths.require("store_attack bench", paths.DAEMON)
    print(f"ddp-rendezvous --max_memory_mib {args.limit_mib} ({paths.DAEMON}); medians of {args.repeats} daemons, "
          f"{args.rounds} rendezvous each")
    print(f"{'attack':<28} {'up':>3} {'peak RSS MiB':>13} {'limit+32':>9} {'rdzv median ms':>15} "
          f"{'rdzv max ms':>12} {'after ms':>9}")
    for name, attack in ATTACKS:
        runs = []
        for _ in range(args.repeats):
            try:
                runs.append(run_attack(attack, args.limit_mib, args.rounds))
            except (OSError, RuntimeError, Failure) as e:  # the daemon died or stopped answering
                runs.append((False, -1, [float("nan")], float("nan")))
                print(f"  ({name}: {e})")
        up = all(r[0] for r in runs)
        peak = median(r[1] for r in runs)
        med = median(median(r[2]) for r in runs) * 1000
        worst = max(max(r[2]) for r in runs) * 1000
        after = median(r[3] for r in runs) * 1000
        print(f"{name:<28} {'yes' if up else 'NO':>3} {peak:>13.1f} {args.limit_mib + 32:>9} {med:>15.2f} "
              f"{worst:>12.2f} {after:>9.2f}")
    print("targets: peak RSS <= limit + 32 MiB; rendezvous <= 100 ms")


if __name__ == "__main__":
    main()
