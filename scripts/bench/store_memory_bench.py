"""The benchmark behind scripts/bench/store_memory (see there)."""
import argparse
import os
import resource
import sys
import time

from harness import paths
from harness.procs import Daemon, status_kib
from harness.runs import Samples, interleaved

sys.path.insert(0, os.path.join(paths.ROOT, "rendezvous", "tools"))
from store_wire import (ERROR, MULTI_SET, OK, PING, SET, SET_WILLS, WAIT, Failure, connect as wire_connect,  # noqa: E402
                        field, frame, i64, keys, message, u32)

IDLE = 2000
WAITED_KEYS = 16384
PAIRS = 4000
BIG = 1 << 20
MAX_ROUNDS = 2000  # a daemon whose budget never refuses still ends


def connect(port, ns):
    return wire_connect(("127.0.0.1", port), namespace=ns, timeout=30.0)


def accepted(conn, kind, body):
    """True for OK, False for an ERROR about the memory limit; Failure for anything else."""
    reply = conn.request(kind, body)
    if reply is None:
        raise Failure(f"the daemon closed the connection on request type {kind}")
    if reply[0] == OK:
        return True
    if reply[0] == ERROR and "memory limit" in message(reply[2]):
        return False
    raise Failure(f"request type {kind}: unexpected reply {reply[0]} {message(reply[2])!r}")


def load(port, limit_mib, mixed):
    """Fills the daemon's budget with the mixed load, or (`mixed` false) with the small
    keys alone; returns (open connections, small keys stored, 1 MiB values stored)."""
    conns = []
    if mixed:
        conns = [connect(port, b"idle-%d" % (i % 200) + (b"n" * 890 if i % 2 else b"")) for i in range(IDLE)]
        wait_body = keys([b"never-%05d" % k for k in range(WAITED_KEYS)]) + i64(600000)
        for i in range(max(1, limit_mib // 16)):
            c = connect(port, b"wait-%d" % i)
            c.send(frame(WAIT, 1000, wait_body))
            conns.append(c)
            accepted(c, PING, b"")  # answered: the WAIT is blocked (or refused: its ERROR comes first)
    wills = u32(16) + b"".join(field(b"failed/%d" % i) + field(b"w" * 64) for i in range(16)) + i64(0)
    value, big = field(b"v" * 64), field(b"b" * BIG)
    large = connect(port, b"large")
    conns.append(large)
    small_keys = large_values = small_refused = 0
    large_refused = 0 if mixed else 3
    writer = None
    for rnd in range(MAX_ROUNDS):
        if small_refused >= 3 and large_refused >= 3:
            break
        if rnd % 4 == 0:
            writer = connect(port, b"small-%d" % rnd)
            conns.append(writer)
            accepted(writer, SET_WILLS, wills)
        body = u32(PAIRS) + b"".join(field(b"k%05d-%04d" % (rnd, i)) + value for i in range(PAIRS))
        if accepted(writer, MULTI_SET, body):
            small_keys += PAIRS
        else:
            small_refused += 1
        if not mixed:
            continue
        if accepted(large, SET, field(b"big-%d" % rnd) + big):
            large_values += 1
        else:
            large_refused += 1
    return conns, small_keys, large_values


def run(limit_mib, mixed):
    """One fresh daemon under a load: (start, peak, after) RSS in MiB, keys, values."""
    env = {k: v for k, v in os.environ.items() if k != "DDPRUN_TOKEN"}
    args = ["--host", "127.0.0.1", "--port", "0", "--max_memory_mib", str(limit_mib), "--max-connections", "100000"]
    with Daemon(args, env) as daemon:
        time.sleep(0.2)
        start = status_kib(daemon.pid) / 1024
        conns, small_keys, large_values = load(daemon.port, limit_mib, mixed)
        peak = status_kib(daemon.pid, "VmHWM") / 1024
        for c in conns:
            c.close()
        after, settled = settle(daemon.pid, start + 16)
        return start, peak, after, settled, small_keys, large_values


def settle(pid, target_mib, limit=10.0):
    """The daemon's RSS in MiB once it reached `target_mib` or stopped falling for a
    second (dropping a million keys takes it a second of CPU), and how many seconds that took."""
    began = time.monotonic()
    last, since = status_kib(pid) / 1024, began
    while time.monotonic() - began < limit:
        time.sleep(0.05)
        now = status_kib(pid) / 1024
        if now <= target_mib:
            return now, time.monotonic() - began
        if now < last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            break
    return last, time.monotonic() - began


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="fresh daemons per limit")
    parser.add_argument("--limits", default="64,256", help="--max_memory_mib values, comma-separated")
    parser.add_argument("--loads", default="mixed,small", help="mixed: the whole load; small: the small keys alone")
    args = parser.parse_args()
    paths.require("store_memory bench", paths.DAEMON)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2,000 idle connections and more
    configs = [(kind, int(limit)) for kind in args.loads.split(",") for limit in args.limits.split(",")]
    samples = Samples()
    for _, order in interleaved(args.runs, configs, alternate=True, progress=True):
        for kind, limit in order:
            for name, value in zip(("start", "peak", "after", "settled", "keys", "values"), run(limit, kind == "mixed")):
                samples[(kind, limit, name)].append(value)
    print(f"ddp-rendezvous ({paths.DAEMON}); medians of {args.runs} runs [min-max]")
    print(f"{'load':<6} {'limit MiB':>9} {'start MiB':>10} {'peak MiB':>17} {'limit+32':>9} {'after MiB':>17} "
          f"{'start+16':>9} {'after s':>8} {'small keys':>11} {'1 MiB values':>13}")
    for kind, limit in configs:
        def cell(name):
            f = samples.figures((kind, limit, name))
            return f"{f.median:.1f} [{f.min:.1f}-{f.max:.1f}]"
        start = samples.median((kind, limit, "start"))
        print(f"{kind:<6} {limit:>9} {start:>10.1f} {cell('peak'):>17} {limit + 32:>9} {cell('after'):>17} "
              f"{start + 16:>9.1f} {samples.median((kind, limit, 'settled')):>8.2f} "
              f"{samples.median((kind, limit, 'keys')):>11.0f} "
              f"{samples.median((kind, limit, 'values')):>13.0f}")
    print("after s: from the last client's close to RSS at start + 16 MiB, or to where it stopped falling")
    print("targets: peak RSS <= limit + 32 MiB; RSS after every client left <= start + 16 MiB")


if __name__ == "__main__":
    main()
