"""The benchmark behind scripts/bench/failover (see there)."""
import argparse
import calendar
import re
import signal
import subprocess
import sys
import time

from harness import paths
from harness.hosts import Hosts
from harness.procs import bench_env
from harness.runs import figures


def node(hosts, i, heartbeat, worker_args):
    argv = hosts.on(i, [paths.DDPRUN, "--nnodes=2", f"--node_rank={i}", f"--master_addr={hosts.address(0)}",
                        "--master_port=29500", "--nproc_per_node=2", f"--heartbeat_timeout={heartbeat}",
                        "--grace_period=5", paths.TEST_WORKER, *worker_args])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=bench_env())


STAMP = re.compile(r"at (\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z")


def stamps(text, after):
    text = text[text.find(after):]
    out = []
    for m in STAMP.finditer(text):
        y, mo, d, h, mi, s, ms = (int(g) for g in m.groups())
        out.append(calendar.timegm((y, mo, d, h, mi, s)) + ms / 1000.0)
    return out


def wait_ready(proc, ranks):
    seen = set()
    deadline = time.monotonic() + 30
    while len(seen) < len(ranks) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.match(r"\[rank(\d+)\]:ready", line)
        if m:
            seen.add(int(m.group(1)))
    if len(seen) < len(ranks):
        sys.exit("failover bench: workers did not start")


def worker_failure(hosts, heartbeat):
    n1 = node(hosts, 1, heartbeat, ["fail", "3", "3"])  # global rank 3 (node 1, local 1) fails after 0.2 s
    n0 = node(hosts, 0, heartbeat, ["fail", "3", "3"])
    _, err0 = n0.communicate(timeout=60)
    _, err1 = n1.communicate(timeout=60)
    failed = stamps(err1, "Root cause")[0]
    return max(stamps(err0, "This node's workers")) - failed


def lost_node(hosts, heartbeat, how):
    n1 = node(hosts, 1, heartbeat, ["ignore-term"])
    n0 = node(hosts, 0, heartbeat, ["trap", str(int(signal.SIGTERM))])
    wait_ready(n0, [0, 1])
    wait_ready(n1, [2, 3])
    start = time.time()
    if how == "kill":
        n1.send_signal(signal.SIGKILL)
    else:
        hosts.set_link(1, "down")
    _, err0 = n0.communicate(timeout=120)
    n1.kill()
    n1.communicate(timeout=60)
    if how == "cut":
        hosts.set_link(1, "up")
    return max(stamps(err0, "This node's workers")) - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--heartbeat_timeout", type=float, default=10.0)
    args = parser.parse_args()
    paths.require_root("failover bench")
    paths.require("failover bench", paths.DDPRUN, paths.TEST_WORKER)
    hb = args.heartbeat_timeout
    with Hosts(2) as hosts:
        rows = [("worker fails on node 1", [worker_failure(hosts, hb) for _ in range(args.runs)], 1.0),
                ("node 1's ddprun SIGKILLed", [lost_node(hosts, hb, "kill") for _ in range(args.runs)], hb),
                ("node 1's link cut", [lost_node(hosts, hb, "cut") for _ in range(args.runs)], hb)]
    print(f"time until node 0's workers are stopped, 2 nodes x 2 workers, heartbeat timeout {hb:g} s, "
          f"median of {args.runs}")
    for name, values, target in rows:
        f = figures(values)
        print(f"{name:<28} median {f.median * 1e3:8.1f} ms  max {f.max * 1e3:8.1f} ms  "
              f"(target <= {target * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
