"""The benchmark behind scripts/bench/hang_exits (see there)."""
import argparse
import contextlib
import re
import subprocess
import sys

from harness import paths
from harness.hosts import Hosts
from harness.procs import bench_env
from harness.runs import figures

# (name, exit_worker arguments, victim, first rank that must fail)
CASES = [
    ("exit 0 before init", ["before_init", "3"], 3, 0),
    ("exit 0 in all_reduce 4 KiB", ["in_collective", "3", "4096"], 3, 0),
    ("exit 0 in all_reduce 8 MiB", ["in_collective", "3", "8388608"], 3, 0),
    ("subgroup member exits", ["subgroup", "3"], 3, 1),  # ranks 1..3 form the subgroup
]
LINE = re.compile(r"^\[rank(\d+)\]:(EXIT|ERROR) (\d+\.\d+)(.*)$")


def run_once(args, hosts):
    """One run on this host (hosts None) or on two test hosts."""
    env = bench_env()
    if hosts is None:
        procs = [subprocess.Popen([paths.DDPRUN, "--nproc_per_node=4", paths.EXIT_WORKER, *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)]
    else:
        procs = []
        for i in (1, 0):
            procs.append(subprocess.Popen(hosts.on(i, [
                paths.DDPRUN, "--nnodes=2", f"--node_rank={i}", f"--master_addr={hosts.address(0)}",
                "--master_port=29500", "--nproc_per_node=2", "--join_timeout=60", paths.EXIT_WORKER, *args]),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
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
    paths.require("hang_exits", paths.DDPRUN, paths.EXIT_WORKER)
    if not a.one_host:
        paths.require_root("hang_exits", "network namespaces; --one-host runs without")
    with contextlib.ExitStack() as stack:
        two = None if a.one_host else stack.enter_context(Hosts(2))
        layouts = [("1 node x 4", None)] + ([] if a.one_host else [("2 hosts x 2", two)])
        everything = []
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
                f = figures(delays)
                print(f"{name:<34} {layout:<12} {a.runs:>4} {f.median * 1000:>10.1f} {f.max * 1000:>8.1f}", flush=True)
        f = figures(everything)
        print(f"{'all':<34} {'':<12} {'':>4} {f.median * 1000:>10.1f} {f.max * 1000:>8.1f}")
        print("target: every surviving rank fails within 1000 ms of the exit:", "met" if f.max < 1.0 else "NOT met")


if __name__ == "__main__":
    main()
