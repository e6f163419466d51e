"""The benchmark behind scripts/bench/deadlock (see there)."""
import argparse
import contextlib
import re
import subprocess
import sys
import threading
import time

from harness import paths
from harness.hosts import Hosts
from harness.procs import bench_env
from harness.runs import Samples, interleaved

CYCLE = "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock"
DEADLOCKED = re.compile(r"rank \d+: deadlocked at (\d+\.\d+)")
NAMED = CYCLE + "; the report follows"  # node 0's line at detection
REPORTED = "stopping the job"           # node 0's line once the report (with stacks) is done


def node_argv(ranks, hosts, node, stall_timeout):
    """ddprun for `node` of a deadlock job: one host with every rank, or rank 0 on host 0
    and the others on host 1 (so the deadlocked recvs cross hosts)."""
    common = [f"--stall_timeout={stall_timeout:g}", "--stall_action=stop", "--grace_period=2",
              paths.COLLECTIVE_WORKER, "deadlock"]
    if hosts is None:
        return [paths.DDPRUN, f"--nproc_per_node={ranks}", "--standalone", *common]
    return hosts.on(node, [paths.DDPRUN, "--nnodes=2", f"--node_rank={node}", f"--master_addr={hosts.address(0)}",
                           "--master_port=29500", f"--nproc_per_node={1 if node == 0 else ranks - 1}",
                           "--join_timeout=60", "--heartbeat_timeout=3", *common])


def run_once(ranks, hosts, stall_timeout):
    """(seconds to the deadlock named, to the full report, node 0's exit status, the
    report names the cycle) from the last rank saying it deadlocked (unix time)."""
    env = bench_env()
    nodes = [0] if hosts is None else [1, 0]
    procs = {n: subprocess.Popen(node_argv(ranks, hosts, n, stall_timeout), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for n in nodes}
    marks, onsets, texts = {}, [], []

    def watch(stream, node):
        for line in stream:
            texts.append(line)
            m = DEADLOCKED.search(line)
            if m:
                onsets.append(float(m.group(1)))
            if node == 0 and NAMED in line:
                marks.setdefault("named", time.time())
            if node == 0 and REPORTED in line:
                marks.setdefault("reported", time.time())

    threads = [threading.Thread(target=watch, args=(s, n), daemon=True)
               for n, p in procs.items() for s in (p.stdout, p.stderr)]
    for t in threads:
        t.start()
    status = {}
    for n, p in procs.items():
        try:
            status[n] = p.wait(stall_timeout + 90)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            sys.exit(f"deadlock bench: {ranks} ranks, {'two hosts' if hosts else 'one host'}: no end in time\n"
                     + "".join(texts)[-3000:])
    for t in threads:
        t.join(10)
    out = "".join(texts)
    if len(onsets) != ranks or "reported" not in marks:
        sys.exit(f"deadlock bench: {ranks} ranks: no deadlock or no report\n{out[-3000:]}")
    onset = max(onsets)
    named = marks.get("named", marks["reported"]) - onset
    return named, marks["reported"] - onset, status[0], ("wait-for cycle: " + CYCLE) in out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stall-timeout", type=float, default=3.0)
    ap.add_argument("--one-host", action="store_true", help="skip the two-host cases (no root needed)")
    a = ap.parse_args()
    paths.require("deadlock bench", paths.DDPRUN, paths.COLLECTIVE_WORKER)
    if not a.one_host:
        paths.require_root("deadlock bench", "network namespaces; --one-host runs without")
    with contextlib.ExitStack() as stack:
        two = None if a.one_host else stack.enter_context(Hosts(2))
        layouts = [("1 host", None)] + ([] if a.one_host else [("2 hosts", two)])
        configs = {f"{r} ranks, {where}": (r, hosts) for where, hosts in layouts for r in (2, 3)}
        named, reported, statuses, cycles = Samples(), Samples(), Samples(), Samples()
        for i, order in interleaved(a.runs, configs, alternate=True, progress=True):
            for k in order:
                n, r, s, c = run_once(*configs[k], a.stall_timeout)
                named[k].append(n)
                reported[k].append(r)
                statuses[k].append(s)
                cycles[k].append(c)
        bound = a.stall_timeout + 2
        print(f"send/recv deadlock to report, --stall_timeout={a.stall_timeout:g} --stall_action=stop, "
              f"{a.runs} runs each (seconds from the last rank entering its recv/barrier)")
        print(f"{'layout':<18} {'named med':>9} {'max':>6} {'report med':>10} {'max':>6}  exit status  cycle named")
        met = True
        for k in configs:
            fn, fr = named.figures(k), reported.figures(k)
            codes = sorted(set(statuses[k]))
            ok = fn.max <= bound and codes == [124] and all(cycles[k])
            met = met and ok
            print(f"{k:<18} {fn.median:9.2f} {fn.max:6.2f} {fr.median:10.2f} {fr.max:6.2f}  "
                  f"{','.join(map(str, codes)):<11}  {sum(cycles[k])}/{len(cycles[k])}")
        print(f"target: named within --stall_timeout + 2 s = {bound:g} s naming the cycle, exit 124: "
              f"{'met' if met else 'NOT met'} (report: after the workers' stacks are read)")
        return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
