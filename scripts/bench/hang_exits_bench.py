"""The benchmark behind scripts/bench/hang_exits (see there)."""
import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
DDPRUN = os.path.join(BUILD, "launcher", "ddprun")
WORKER = os.path.join(BUILD, "tests", "exit_worker")
PREFIX = f"ddph{os.getpid() % 100000}"
SUBNET = f"10.215.{os.getpid() % 250}"

# (name, exit_worker arguments, victim, first rank that must fail)
CASES = [
    ("exit 0 before init", ["before_init", "3"], 3, 0),
    ("exit 0 in all_reduce 4 KiB", ["in_collective", "3", "4096"], 3, 0),
    ("exit 0 in all_reduce 8 MiB", ["in_collective", "3", "8388608"], 3, 0),
    ("subgroup member exits", ["subgroup", "3"], 3, 1),  # ranks 1..3 form the subgroup
]
LINE = re.compile(r"^\[rank(\d+)\]:(EXIT|ERROR) (\d+\.\d+)(.*)$")


def run_once(args, hosts):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if hosts == 1:
        procs = [subprocess.Popen([DDPRUN, "--nproc_per_node=4", WORKER, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)]
    else:
        procs = []
        for i in (1, 0):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}-n{i}", DDPRUN, "--nnodes=2", f"--node_rank={i}",
                 f"--master_addr={SUBNET}.1", "--master_port=29500", "--nproc_per_node=2", "--join_timeout=60",
                 WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    out = ""
    for p in procs:
        text, _ = p.communicate(timeout=120)
        out += text
    exits, errors = {}, {}
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            (exits if m.group(2) == "EXIT" else errors)[int(m.group(1))] = (float(m.group(3)), m.group(4))
    return exits, errors, out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--one-host", action="store_true", help="skip the two-host cases (no root needed)")
    a = ap.parse_args()
    for path in (DDPRUN, WORKER):
        if not os.access(path, os.X_OK):
            sys.exit(f"hang_exits: {path} is missing: build first (BUILD_DIR={BUILD})")
    layouts = [("1 node x 4", 1)] + ([] if a.one_host else [("2 hosts x 2", 2)])
    if not a.one_host:
        netns_hosts.make_hosts(PREFIX, SUBNET)
    everything = []
    try:
        print(f"{'case':<34} {'layout':<12} {'runs':>4} {'median ms':>10} {'max ms':>8}")
        for layout, hosts in layouts:
            for name, args, victim, first in CASES:
                delays = []
                for _ in range(a.runs):
                    exits, errors, out = run_once(args, hosts)
                    if victim not in exits:
                        sys.exit(f"hang_exits: {name}: the victim did not report its exit\n{out}")
                    for r in range(first, 4):
                        if r == victim:
                            continue
                        if r not in errors or f"rank {victim} " not in errors[r][1]:
                            sys.exit(f"hang_exits: {name}: rank {r} did not fail naming rank {victim}\n{out}")
                        delays.append(errors[r][0] - exits[victim][0])
                everything += delays
                print(f"{name:<34} {layout:<12} {a.runs:>4} {statistics.median(delays) * 1000:>10.1f} "
                      f"{max(delays) * 1000:>8.1f}", flush=True)
        print(f"{'all':<34} {'':<12} {'':>4} {statistics.median(everything) * 1000:>10.1f} "
              f"{max(everything) * 1000:>8.1f}")
        print("target: every surviving rank fails within 1000 ms of the exit:",
              "met" if max(everything) < 1.0 else "NOT met")
    finally:
        if not a.one_host:
            netns_hosts.remove_hosts(PREFIX)


if __name__ == "__main__":
    main()
