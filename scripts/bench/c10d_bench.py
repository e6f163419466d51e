"""The benchmark behind scripts/bench/c10d (see there).

Terms used below:
  hosts      two network namespaces with host names node0 and node1 (a UTS namespace per
             launcher) and a hosts file each mapping both names, as machines have them:
             torchrun recognises the endpoint's host only by name or address of its own
  recipe     PyTorch's multi-node c10d recipe, the same words for both launchers:
             --nnodes=... --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=node0:29400
             --rdzv_id=<fresh> --rdzv_conf=last_call_timeout=1 --monitor_interval=0.1
             --no_python /bin/sh -c WORKER, no --node_rank
  start line what each worker prints first: its world size, rank and the wall clock
  fixed      --nnodes=2: node1's launcher starts, then node0's (the host, last); from the
             last launcher start to the latest start line of the 4 workers of world 4
  elastic    --nnodes=1:3: node0 runs alone (world 2); node1's launcher starts; from then
             to the latest start line of the 4 workers of world 4 (the job re-formed)
The workers of the final world exit 0, so each run ends with both launchers' exit status.
"""
import argparse
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

from harness import paths
from harness.hosts import Hosts
from harness.runs import Samples, interleaved

PORT = 29400
START = re.compile(r"C10D_START world=(\d+) rank=(\d+) t=([\d.]+)")
WORKER = ('echo "C10D_START world=$WORLD_SIZE rank=$RANK t=$(date +%s.%N)"; '
          '[ "$WORLD_SIZE" = 4 ] && exit 0; exec sleep 300')
ROWS = {"fixed": ("2", "c10d endpoint, 2 nodes (fixed)"), "elastic": ("1:3", "c10d endpoint 1:3, a node joins")}


class Launcher:
    """One launcher process on a named host; its output lines, read as they come."""

    def __init__(self, hosts, i, argv, env):
        cmd = hosts.on(i, ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', f"node{i}", *argv])
        self.started = time.time()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def starts(self, world):
        """{rank: wall-clock start} of the workers of this world size, each rank's first."""
        seen = {}
        for line in list(self.lines):
            m = START.search(line)
            if m and int(m.group(1)) == world:
                seen.setdefault(int(m.group(2)), float(m.group(3)))
        return seen

    def stop(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        self.reader.join(5)


def recipe(launcher, nnodes, run_id):
    words = [f"--nnodes={nnodes}", "--nproc_per_node=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=node0:{PORT}",
             f"--rdzv_id={run_id}", "--rdzv_conf=last_call_timeout=1", "--monitor_interval=0.1", "--no_python",
             "/bin/sh", "-c", WORKER]
    return ([paths.DDPRUN] if launcher == "ddprun" else [paths.TORCH2, "torchrun"]) + words


def wait_for(cond, timeout, what):
    until = time.time() + timeout
    while time.time() < until:
        if cond():
            return
        time.sleep(0.02)
    raise TimeoutError(what)


def one_run(hosts, launcher, row, env):
    """Seconds from the last launcher's start to every worker of world 4 started."""
    nnodes = ROWS[row][0]
    run_id = "c10d" + secrets.token_hex(4)
    nodes = []
    try:
        if row == "fixed":
            nodes.append(Launcher(hosts, 1, recipe(launcher, nnodes, run_id), env))
            nodes.append(Launcher(hosts, 0, recipe(launcher, nnodes, run_id), env))
        else:
            nodes.append(Launcher(hosts, 0, recipe(launcher, nnodes, run_id), env))
            wait_for(lambda: len(nodes[0].starts(2)) == 2, 120, f"{launcher}: node0 alone did not start world 2")
            nodes.append(Launcher(hosts, 1, recipe(launcher, nnodes, run_id), env))
        last_start = max(n.started for n in nodes)
        for n in nodes:
            try:
                status = n.p.wait(120)
            except subprocess.TimeoutExpired:
                status = None
            if status != 0:
                tail = "\n".join(n.lines[-30:])
                raise RuntimeError(f"{launcher} {row}: a launcher ended with {status}:\n{tail}")
        stamps = {}
        for n in nodes:
            stamps.update({(id(n), r): t for r, t in n.starts(4).items()})
        if len(stamps) != 4:
            raise RuntimeError(f"{launcher} {row}: {len(stamps)} of 4 workers of world 4 started")
        return max(stamps.values()) - last_start
    finally:
        for n in nodes:
            n.stop()


def write_hosts_files(hosts):
    made = []
    for i in range(hosts.count):
        d = os.path.join("/etc/netns", hosts.ns(i))
        os.makedirs(d, exist_ok=True)
        made.append(d)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{hosts.address(k)} node{k}\n" for k in range(hosts.count)))
    return made


def main():
    ap = argparse.ArgumentParser(description="torchrun's c10d recipe on two hosts, ddprun vs torchrun 2.15")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--launchers", default="ddprun,torchrun", help="comma list of ddprun, torchrun")
    ap.add_argument("--rows", default="fixed,elastic", help="comma list of fixed, elastic")
    a = ap.parse_args()
    launchers, rows = a.launchers.split(","), a.rows.split(",")
    if any(x not in ("ddprun", "torchrun") for x in launchers) or any(r not in ROWS for r in rows):
        sys.exit("c10d bench: --launchers takes ddprun,torchrun; --rows takes fixed,elastic")
    paths.require_root("c10d bench")
    paths.require("c10d bench", paths.DDPRUN)
    if "torchrun" in launchers:
        paths.require_peers("c10d bench", paths.TORCH2)
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
    samples = Samples()
    with Hosts(2) as hosts:
        made = write_hosts_files(hosts)
        try:
            configs = [(row, launcher) for row in rows for launcher in launchers]
            for i, order in interleaved(a.runs, configs, alternate=True, progress=True):
                for row, launcher in order:
                    s = one_run(hosts, launcher, row, env)
                    samples[(row, launcher)].append(s)
                    print(f"{time.strftime('%H:%M:%S')} run {i + 1} {row:8} {launcher:9} {s * 1000:9.1f} ms",
                          flush=True)
        finally:
            for d in made:
                shutil.rmtree(d, ignore_errors=True)
    print(f"\n{'recipe':34} {'launcher':9} {'median ms':>10} {'min':>9} {'max':>9} runs")
    for row in rows:
        for launcher in launchers:
            f = samples.figures((row, launcher))
            print(f"{ROWS[row][1]:34} {launcher:9} {f.median * 1000:10.1f} {f.min * 1000:9.1f} {f.max * 1000:9.1f} "
                  f"{f.runs}")
        if len(launchers) == 2:
            ratio = samples.median((row, "ddprun")) / samples.median((row, "torchrun"))
            print(f"ratio ddprun/torchrun, {ROWS[row][1]}: {ratio:.3f} (target <= 0.1: "
                  f"{'met' if ratio <= 0.1 else 'NOT met'})")


if __name__ == "__main__":
    main()
