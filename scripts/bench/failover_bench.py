"""The benchmark behind scripts/bench/failover (see there)."""
import argparse
import calendar
import os
import re
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
DDPRUN = os.path.join(BUILD, "launcher", "ddprun")
WORKER = os.path.join(BUILD, "tests", "test_worker")
PREFIX = f"ddpb{os.getpid() % 100000}"
SUBNET = f"10.214.{os.getpid() % 250}"


def make_hosts():
    netns_hosts.make_hosts(PREFIX, SUBNET)


def remove_hosts():
    netns_hosts.remove_hosts(PREFIX)


def node(i, heartbeat, worker_args):
    argv = ["ip", "netns", "exec", f"{PREFIX}-n{i}", DDPRUN, "--nnodes=2", f"--node_rank={i}",
            f"--master_addr={SUBNET}.1", "--master_port=29500", "--nproc_per_node=2",
            f"--heartbeat_timeout={heartbeat}", "--grace_period=5", WORKER, *worker_args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


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


def worker_failure(heartbeat):
    n1 = node(1, heartbeat, ["fail", "3", "3"])  # global rank 3 (node 1, local 1) fails after 0.2 s
    n0 = node(0, heartbeat, ["fail", "3", "3"])
    _, err0 = n0.communicate(timeout=60)
    _, err1 = n1.communicate(timeout=60)
    failed = stamps(err1, "Root cause")[0]
    return max(stamps(err0, "This node's workers")) - failed


def lost_node(heartbeat, how):
    n1 = node(1, heartbeat, ["ignore-term"])
    n0 = node(0, heartbeat, ["trap", str(int(signal.SIGTERM))])
    wait_ready(n0, [0, 1])
    wait_ready(n1, [2, 3])
    start = time.time()
    if how == "kill":
        n1.send_signal(signal.SIGKILL)
    else:
        netns_hosts.ip("-n", f"{PREFIX}-n1", "link", "set", "eth0", "down")
    _, err0 = n0.communicate(timeout=120)
    n1.kill()
    n1.communicate(timeout=60)
    if how == "cut":
        netns_hosts.ip("-n", f"{PREFIX}-n1", "link", "set", "eth0", "up")
    return max(stamps(err0, "This node's workers")) - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--heartbeat_timeout", type=float, default=10.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("failover bench: needs root (network namespaces)")
    make_hosts()
    try:
        hb = args.heartbeat_timeout
        rows = [("worker fails on node 1", [worker_failure(hb) for _ in range(args.runs)], 1.0),
                ("node 1's ddprun SIGKILLed", [lost_node(hb, "kill") for _ in range(args.runs)], hb),
                ("node 1's link cut", [lost_node(hb, "cut") for _ in range(args.runs)], hb)]
    finally:
        remove_hosts()
    print(f"time until node 0's workers are stopped, 2 nodes x 2 workers, heartbeat timeout {hb:g} s, "
          f"median of {args.runs}")
    for name, values, target in rows:
        print(f"{name:<28} median {statistics.median(values) * 1e3:8.1f} ms  max {max(values) * 1e3:8.1f} ms  "
              f"(target <= {target * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
