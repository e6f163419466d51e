"""The benchmark behind scripts/bench/elastic (see there).

Terms used below:
  job        one launch of three (or, for grow, first two) nodes at --nnodes 2:3, one
             launcher per network namespace, all running elastic_worker.py
  ready line what elastic_worker.py prints once init_process_group returned (its wall-clock
             stamp, rank, world size, restart count)
  attempt    the ready lines of world size W stamped after the event, each rank's first;
             complete when every rank 0..W-1 printed and each expected node brought its
             --nproc_per_node workers
  recovery   from the event (kill, link cut, new node's launcher start) to the latest ready
             stamp of the first complete attempt of the expected world
"""
import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

from harness import paths
from harness.hosts import Hosts
from harness.procs import Daemon
from harness.runs import figures, interleaved

DAEMON_NODE, DAEMON_PORT = 3, 29399  # --store daemon: ddp-rendezvous alone in a 4th namespace
WORKER = os.path.join(paths.BENCH_DIR, "elastic_worker.py")
NODES = 3
READY = re.compile(r"ELASTIC_READY rank=(\d+) world=(\d+) restarts=(-?\d+) group_rank=(-?\d+) "
                   r"group_world=(-?\d+) pid=(\d+) t=([\d.]+)")
SCENARIOS = {"kill": "node 2 SIGKILLed", "cut": "node 2 link cut", "grow": "node 2 joins"}


class NoRecovery(Exception):
    """A job that did not reach the expected world in time (or whose launcher gave up)."""


def say(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Job:
    """One launch: a launcher per node, each writing stdout+stderr to its own log file."""

    def __init__(self, a, hosts, launcher, tag, port, env):
        self.a, self.hosts, self.launcher, self.port, self.env = a, hosts, launcher, port, env
        self.run_id = f"eb{port}"
        self.logs = {n: os.path.join(a.log_dir, f"{tag}-n{n}.log") for n in range(NODES)}
        self.procs = {}

    def argv(self, node):
        a, hosts = self.a, self.hosts
        worker = [WORKER, "--pg_timeout", str(a.pg_timeout)]
        if self.launcher == "ddprun":
            daemon = [f"--rdzv_endpoint={hosts.address(DAEMON_NODE)}:{DAEMON_PORT}"] if a.store == "daemon" else []
            return [paths.DDPRUN, "--nnodes=2:3", f"--nproc_per_node={a.nproc_per_node}", f"--node_rank={node}",
                    f"--master_addr={hosts.address(0)}", f"--master_port={self.port}", *daemon,
                    f"--rdzv_id={self.run_id}",
                    f"--rdzv_conf=last_call_timeout={a.last_call_timeout:g}", "--max_restarts=3",
                    f"--heartbeat_timeout={a.heartbeat_timeout:g}", f"--grace_period={a.grace_period:g}",
                    *worker]
        conf = f"is_host={int(node == 0)}"  # every namespace has the same hostname: say who hosts
        if a.torchrun_last_call_timeout is not None:
            conf += f",last_call_timeout={a.torchrun_last_call_timeout:g}"
        return [paths.TORCH2, "torchrun", "--nnodes=2:3", f"--nproc_per_node={a.nproc_per_node}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={hosts.address(0)}:{self.port}", f"--rdzv_id={self.run_id}",
                f"--rdzv_conf={conf}", "--max_restarts=3", f"--local_addr={hosts.address(node)}",
                "--monitor_interval=0.1", *worker]

    def start(self, node):
        env = dict(self.env)
        if self.launcher == "torchrun" and not self.a.torchrun_share_store:
            # torch 2.15 caches the bootstrap store info of its first round: in a later round the
            # old rank 0 never publishes MASTER_ADDR under the new round's keys and a joining
            # node waits for it until the 60 s store timeout (scale-up never happens). Its
            # documented opt-out of the shared TCPStore rebuilds that info every round.
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        with open(self.logs[node], "w") as log:
            self.procs[node] = subprocess.Popen(self.hosts.on(node, self.argv(node)),
                                                stdout=log, stderr=subprocess.STDOUT, env=env)

    def ready_lines(self, nodes, after):
        out = []
        for n in nodes:
            with open(self.logs[n], errors="replace") as f:
                for m in READY.finditer(f.read()):
                    line = {"node": n, "rank": int(m[1]), "world": int(m[2]), "restarts": int(m[3]),
                            "t": float(m[7])}
                    if line["t"] > after:
                        out.append(line)
        return out

    def wait_world(self, nodes, after, timeout):
        """The first complete attempt of len(nodes) x nproc workers stamped after `after`:
        (latest stamp, restart counts seen). Raises NoRecovery on timeout or a launcher's exit.

        A ready line of world W means gloo connected all W ranks of its attempt, so every rank
        of that attempt prints one: each rank's earliest line of world W belongs to the first
        attempt of W. Attempts are not told apart by restart count: torchrun's agents count
        their own restarts, and two nodes can disagree after a failed re-form."""
        world = len(nodes) * self.a.nproc_per_node
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            first = {}
            for line in sorted(self.ready_lines(nodes, after), key=lambda x: x["t"]):
                if line["world"] == world:
                    first.setdefault(line["rank"], line)
            if sorted(first) == list(range(world)):
                lines = first.values()
                per_node = [sum(x["node"] == n for x in lines) for n in nodes]
                if per_node != [self.a.nproc_per_node] * len(nodes):
                    raise NoRecovery(f"world {world} formed with {per_node} workers on nodes {nodes}")
                return max(x["t"] for x in lines), sorted({x["restarts"] for x in lines})
            for n in nodes:
                if n in self.procs and self.procs[n].poll() is not None:
                    raise NoRecovery(f"node {n}'s {self.launcher} exited with status {self.procs[n].returncode}"
                                     f" before a world of {world} was running")
            time.sleep(0.05)
        raise NoRecovery(f"no complete world of {world} within {timeout:g} s")

    def stop(self):
        self.hosts.kill_every_host(self.procs.values())

    def tails(self, lines=15):
        text = []
        for n, path in self.logs.items():
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                text.append(f"--- node {n} ({path}):\n" + "\n".join(tail))
        return "\n".join(text)


def counts(restarts):
    return "/".join(str(x) for x in restarts)


def run_once(a, hosts, launcher, scenario, tag, port, env):
    """One job, one event; returns (seconds to recovery, restart counts before, after), the
    counts as text: "1", or "1/2" when nodes disagree."""
    job = Job(a, hosts, launcher, tag, port, env)
    first_nodes = [0, 1] if scenario == "grow" else [0, 1, 2]
    try:
        for n in first_nodes:
            job.start(n)
        _, before = job.wait_world(first_nodes, 0, a.start_timeout)
        time.sleep(a.settle)  # a few training steps, so the event hits collectives in flight
        t0 = time.time()
        if scenario == "kill" and a.kill == "launcher":
            job.procs[2].send_signal(signal.SIGKILL)  # `ip netns exec` and torch2 exec: this is the launcher
        elif scenario == "kill":
            hosts.kill_all(2)
        elif scenario == "cut":
            hosts.set_link(2, "down")
        else:
            job.start(2)
        stamp, after = job.wait_world([0, 1, 2] if scenario == "grow" else [0, 1], t0, a.recover_timeout)
        # The restart rule: a lost node consumes a restart, a joining one does not.
        # torchrun's figures are only reported (its agents count restarts each on their own).
        expected = [before[0] + (scenario != "grow")] if len(before) == 1 else None
        if launcher == "ddprun" and after != expected:
            raise NoRecovery(f"restart count {counts(before)} -> {counts(after)}, expected {counts(expected or [])}")
        return stamp - t0, counts(before), counts(after)
    except NoRecovery as e:
        raise NoRecovery(f"{e}\n{job.tails()}") from None
    finally:
        job.stop()
        if scenario == "cut":
            hosts.set_link(2, "up")


def start_daemon(a, hosts, env):
    """ddp-rendezvous for every job of the run (each has its own --rdzv_id), alone on its host."""
    return Daemon([f"--port={DAEMON_PORT}", f"--heartbeat_timeout={a.heartbeat_timeout:g}"], env,
                  on=hosts.on(DAEMON_NODE, []), log=os.path.join(a.log_dir, "ddp-rendezvous.log"))


def torch2_env():
    p = subprocess.run([paths.TORCH2, "env"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"elastic bench: {paths.TORCH2} env failed:\n{p.stderr}")
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)


def target(a, scenario):
    return {"kill": 2.0, "cut": a.heartbeat_timeout + 2.0, "grow": 2.0 + a.grace_period}[scenario]


def report(a, results, failures):
    print()
    store = "node 0's embedded store" if a.store == "node0" else "ddp-rendezvous in a 4th namespace"
    setup = [f"3 nodes at --nnodes 2:3 (network namespaces), {a.nproc_per_node} torch DDP worker(s) per node "
             f"(gloo), SIGKILL to {'all of node 2' if a.kill == 'node' else 'the launcher'}",
             f"ddprun: {store}, last_call_timeout {a.last_call_timeout:g} s, heartbeat {a.heartbeat_timeout:g} s, "
             f"grace {a.grace_period:g} s"]
    if "torchrun" in a.launchers:
        last_call = "default (30 s)" if a.torchrun_last_call_timeout is None else f"{a.torchrun_last_call_timeout:g} s"
        setup.append(f"torchrun 2.15: c10d on node 0, last_call_timeout {last_call}"
                     f"{', shared TCPStore' if a.torchrun_share_store else ', TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1'}")
    print("elastic recovery, " + "; ".join(setup))
    print(f"{'event':<18} {'launcher':<9} {'ok':>5} {'median':>9} {'min':>8} {'max':>8} {'restarts':>9}  target")
    medians = {}
    for scenario in a.scenarios:
        for launcher in a.launchers:
            rows = results.get((scenario, launcher))
            if rows is None:
                continue
            runs = f"{len(rows)}/{len(rows) + failures.get((scenario, launcher), 0)}"
            if not rows:
                print(f"{SCENARIOS[scenario]:<18} {launcher:<9} {runs:>5}   (no run recovered)")
                continue
            secs = figures(r[0] for r in rows)
            med = medians[(scenario, launcher)] = secs.median
            restarts = sorted({f"{r[1]}->{r[2]}" for r in rows})
            goal = ""
            if launcher == "ddprun":
                goal = f"<= {target(a, scenario):g} s {'met' if med <= target(a, scenario) else 'MISSED'}"
            print(f"{SCENARIOS[scenario]:<18} {launcher:<9} {runs:>5} {med:8.2f}s {secs.min:7.2f}s "
                  f"{secs.max:7.2f}s {','.join(restarts):>9}  {goal}")
    for scenario in a.scenarios:
        ours, theirs = medians.get((scenario, "ddprun")), medians.get((scenario, "torchrun"))
        if ours is not None and theirs:
            goal = f"  (target <= 0.2 {'met' if ours / theirs <= 0.2 else 'MISSED'})" if scenario == "kill" else ""
            print(f"ratio ddprun/torchrun, {SCENARIOS[scenario]}: {ours / theirs:.3f}{goal}")
    if any(launcher == "torchrun" for _, launcher in failures):
        print("torchrun's runs that did not recover are left out of its figures (the peer's failures "
              "are reported, not counted against ddprun's exit status)")


def main():
    ap = argparse.ArgumentParser(description="elastic recovery and scale-up, ddprun vs torchrun")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--launchers", default="ddprun,torchrun", help="comma list of ddprun, torchrun")
    ap.add_argument("--scenarios", default="kill,cut,grow", help="comma list of kill, cut, grow")
    ap.add_argument("--torchrun_scenarios", default="kill,grow",
                    help="the scenarios torchrun runs too (a cut leaves its survivors in gloo's timeout)")
    ap.add_argument("--nproc_per_node", type=int, default=1)
    ap.add_argument("--kill", choices=["node", "launcher"], default="node",
                    help="kill: every process of node 2 at once (the host dies), or its launcher alone "
                         "(its workers are left to the launcher's design)")
    ap.add_argument("--store", choices=["node0", "daemon"], default="node0",
                    help="ddprun's store: node 0's embedded one, or a ddp-rendezvous daemon in a 4th namespace")
    ap.add_argument("--heartbeat_timeout", type=float, default=5.0)
    ap.add_argument("--grace_period", type=float, default=2.0)
    ap.add_argument("--last_call_timeout", type=float, default=1.0, help="ddprun's --rdzv_conf last_call_timeout")
    ap.add_argument("--torchrun_last_call_timeout", type=float, default=None,
                    help="torchrun's --rdzv_conf last_call_timeout (default: torchrun's own, 30 s)")
    ap.add_argument("--torchrun_share_store", action="store_true",
                    help="leave torchrun's shared rendezvous TCPStore on (its default; scale-up then hangs)")
    ap.add_argument("--pg_timeout", type=float, default=60.0, help="the worker's process group timeout")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of training before the event")
    ap.add_argument("--start_timeout", type=float, default=120.0)
    ap.add_argument("--recover_timeout", type=float, default=120.0)
    ap.add_argument("--log_dir", help="keep the launchers' logs here (default: a temporary folder, "
                    "kept only when a run fails)")
    a = ap.parse_args()
    a.launchers = [x for x in a.launchers.split(",") if x]
    a.scenarios = [x for x in a.scenarios.split(",") if x]
    torchrun_scenarios = set(a.torchrun_scenarios.split(","))
    bad = [x for x in a.launchers if x not in ("ddprun", "torchrun")] + \
          [x for x in a.scenarios + list(torchrun_scenarios - {""}) if x not in SCENARIOS]
    if bad or a.runs < 1 or a.nproc_per_node < 1:
        sys.exit(f"elastic bench: bad arguments {bad or ''} (launchers: ddprun,torchrun; scenarios: "
                 f"{','.join(SCENARIOS)}; --runs and --nproc_per_node >= 1)")
    paths.require_root("elastic bench")
    if "ddprun" in a.launchers:
        paths.require("elastic bench", paths.DDPRUN, *([paths.DAEMON] if a.store == "daemon" else []))
    keep_logs = a.log_dir is not None
    a.log_dir = a.log_dir or tempfile.mkdtemp(prefix="ddprun-elastic-bench-")
    os.makedirs(a.log_dir, exist_ok=True)

    paths.require_peers("elastic bench", paths.TORCH2)
    t2 = torch2_env()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="eth0",
               DDPRUN_TOKEN=secrets.token_hex(16), PYTHON_EXEC=t2["PYTHON_EXEC"],
               LD_LIBRARY_PATH=t2["LD_LIBRARY_PATH"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("elastic bench: terminated"))
    results, failures, port = {}, {}, 29400
    hosts = Hosts(NODES + (a.store == "daemon"))
    try:
        if a.store == "daemon":
            start_daemon(a, hosts, env)
        # Alternate which launcher goes first, so outside load hits both alike.
        for i, order in interleaved(a.runs, a.launchers, alternate=True):
            for scenario in a.scenarios:
                for launcher in order:
                    if launcher == "torchrun" and scenario not in torchrun_scenarios:
                        continue
                    port += 2  # a fresh port per job: nothing waits out TIME_WAIT or an old store
                    key = (scenario, launcher)
                    results.setdefault(key, [])
                    try:
                        secs, before, after = run_once(a, hosts, launcher, scenario,
                                                       f"{i + 1:02d}-{scenario}-{launcher}", port, env)
                    except NoRecovery as e:
                        failures[key] = failures.get(key, 0) + 1
                        keep_logs = True
                        say(f"run {i + 1}/{a.runs} {SCENARIOS[scenario]}, {launcher}: FAILED: {e}")
                        continue
                    results[key].append((secs, before, after))
                    say(f"run {i + 1}/{a.runs} {SCENARIOS[scenario]}, {launcher}: running again after "
                        f"{secs:.2f} s (restart count {before} -> {after})")
    finally:
        for n in range(hosts.count):
            hosts.kill_all(n)  # the daemon's host too
        hosts.close()
    report(a, results, failures)
    if keep_logs:
        print(f"logs: {a.log_dir}")
    else:
        subprocess.run(["rm", "-rf", a.log_dir])
    ours = sum(v for (_, launcher), v in failures.items() if launcher == "ddprun")
    if ours:
        sys.exit(f"elastic bench: {ours} ddprun run(s) did not recover")


if __name__ == "__main__":
    main()
