"""The benchmark behind scripts/bench/rendezvous (see there)."""
import argparse
import os
import re
import resource
import socket
import subprocess
import sys
import time

from harness import paths
from harness.procs import Daemon, status_kib
from harness.runs import median

TOKEN = "bench-token"


def start_daemon():
    return Daemon(["--host", "127.0.0.1", "--port", "0", "--max-connections", "100000"],
                  dict(os.environ, DDPRUN_TOKEN=TOKEN))


def rendezvous_run(clients):
    """One fresh daemon, `clients` clients through it. Returns (seconds, peak KiB, KiB per idle connection)."""
    with start_daemon() as daemon:
        baseline = status_kib(daemon.pid)
        bench = subprocess.Popen([paths.STORE_BENCH, "rendezvous", "127.0.0.1", str(daemon.port), TOKEN, str(clients)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = bench.stdout.readline()
        m = re.search(r"after ([0-9.]+) s", first)
        if not m:
            sys.exit("rendezvous bench: " + first)
        if bench.stdout.readline().strip() != "idle":
            sys.exit("rendezvous bench: the load generator did not go idle")
        time.sleep(0.2)  # let the server finish writing the last replies
        idle = status_kib(daemon.pid)
        peak = status_kib(daemon.pid, "VmHWM")
        bench.stdin.close()
        bench.wait(timeout=60)
        return float(m.group(1)), peak, (idle - baseline) / clients


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ours_ops(op, seconds):
    with start_daemon() as daemon:
        out = subprocess.run([paths.STORE_BENCH, "throughput", "127.0.0.1", str(daemon.port), TOKEN, "64",
                              str(seconds), op], check=True, capture_output=True, text=True).stdout
        return float(re.search(r": ([0-9.]+) ops/s", out).group(1))


def redis_ops(requests):
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", "64", "-t", "set,get", "-n", str(requests),
                              "-q"], check=True, capture_output=True, text=True).stdout
        # With -q each test ends in "SET: 57142.86 requests per second, ..." after carriage returns.
        found = dict(re.findall(r"(SET|GET): ([0-9.]+) requests per second", out.replace("\r", "\n")))
        return float(found["SET"]), float(found["GET"])
    finally:
        server.terminate()
        server.wait(timeout=10)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each of our throughput runs")
    args = parser.parse_args()
    paths.require("rendezvous bench", paths.DAEMON, paths.STORE_BENCH)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by daemon and load generator

    print(f"(a) rendezvous through one ddp-rendezvous (token auth), median of {args.repeats}")
    print(f"{'clients':>8} {'all have nccl_id s':>19} {'server peak RSS MiB':>20} {'KiB / idle conn':>16}")
    for n in (1024, 4096, 16384):
        runs = [rendezvous_run(n) for _ in range(args.repeats)]
        secs = median(r[0] for r in runs)
        peak = median(r[1] for r in runs) / 1024
        per = median(r[2] for r in runs)
        print(f"{n:>8} {secs:>19.3f} {peak:>20.1f} {per:>16.2f}")
    print("targets: 16,384 clients in < 2 s; <= 4 KiB per idle connection")

    print(f"\n(b) 64 clients, one request at a time: ddprun store vs redis-server, median of {args.repeats}")
    ours = {"set": [], "get": []}
    redis = {"set": [], "get": []}
    for _ in range(args.repeats):  # interleaved
        ours["set"].append(ours_ops("set", args.seconds))
        ours["get"].append(ours_ops("get", args.seconds))
        s, g = redis_ops(200000)
        redis["set"].append(s)
        redis["get"].append(g)
    for op in ("set", "get"):
        o, r = median(ours[op]), median(redis[op])
        print(f"{op.upper()}: ddprun store {o:,.0f} ops/s, redis-server {r:,.0f} ops/s, ratio {o / r:.2f} "
              f"(target >= 0.80)")


if __name__ == "__main__":
    main()
