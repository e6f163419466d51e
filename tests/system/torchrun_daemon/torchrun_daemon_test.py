"""torchrun's c10d rendezvous through ddp-rendezvous: Debian's torchrun (torch 1.13) on
real hosts, the daemon on a host of its own (the CTest tests "multinode: torchrun 1.13
c10d through ddp-rendezvous ...").

    torchrun_daemon_test.py --case forms|reform|join|refused [--store daemon|torch] [--log_dir DIR]

Three network-namespace hosts, each with its own host name and hosts file: `rdzv` runs
`ddp-rendezvous --torch-clients ID`, `nodea` and `nodeb` run one torchrun agent each with
`--rdzv_backend=c10d --rdzv_endpoint=<rdzv's address>:PORT --rdzv_id=ID --nproc_per_node=2`.
The daemon is not on the agents' machine, so torchrun's is_host guess is false on both and
every agent is a client of the daemon. The workers (worker.py) run init_process_group("gloo")
from the environment torchrun gives them and all-reduce.

  forms    --nnodes=2: every rank 0..3 runs once with WORLD_SIZE 4, the all-reduce sums, both
           agents exit 0; the daemon logs each torch connection once; then a second job with
           the same id forms on the same daemon (the first job's namespace went with its last
           connection: torch's rendezvous of a finished job is closed and would refuse it).
  reform   --nnodes=2 --max_restarts=1: the last rank of the first world exits 3; both agents
           re-form the round through the daemon and the new world of 4 completes.
  join     --nnodes=1:2: nodea alone forms a world of 2; nodeb starts late and joins; nodea
           re-forms and the world of 4 completes.
  refused  a daemon without --torch-clients: torchrun fails with its own error within its
           timeouts instead of hanging.

--store torch serves the rendezvous from torch's own TCPStore in a Python process on `rdzv`
instead (a stand-in for debugging this harness; the CTest tests use the daemon). Needs root,
a build (BUILD_DIR) and Debian's python3-torch. Exit 0 when every check passed, 1 otherwise.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts", "bench"))

from harness import paths  # noqa: E402
from harness.procs import Daemon  # noqa: E402
from recipes_bench import RecipeHosts  # noqa: E402  (hosts with their own names and hosts files)

WORKER = os.path.join(HERE, "worker.py")
TORCHRUN = os.path.join(HERE, "..", "..", "support", "torchrun.py")  # Debian's torchrun, fixed for Python 3.11
PORT = 29400
RUN_ID = "trd-job"
NPROC = 2
JOB_TIMEOUT = 120.0  # s a job may take, re-form included
REFUSE_TIMEOUT = 45.0  # s torchrun may take to give up on a store that refuses it (read_timeout 10)
LINE = re.compile(r"TRD_WORKER host=(\S+) rank=(\d+) world=(\d+) local_rank=(\d+) group_rank=(\d+) "
                  r"restarts=(\d+) first=(\d) master=(\S+) agent_store=(\S+) sum=(\d+)")
# The daemon's line for an admitted torch connection names its peer as ADDRESS:PORT.
TORCH_CONNECTION = re.compile(r"torch.*?(\d+\.\d+\.\d+\.\d+):(\d+)", re.IGNORECASE)
# torch's own server as the stand-in: it prints the daemon's start line, so one reader serves both.
STAND_IN = ("import datetime, sys, time, torch.distributed as d\n"
            "s = d.TCPStore('0.0.0.0', int(sys.argv[1]), is_master=True, wait_for_workers=False,"
            " timeout=datetime.timedelta(seconds=60))\n"
            "print(f'ddp-rendezvous listening on 0.0.0.0:{sys.argv[1]} (torch stand-in)', flush=True)\n"
            "time.sleep(3600)\n")

failures = []


def check(ok, what):
    print(("ok      " if ok else "FAILED  ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


class StandIn(Daemon):
    """torch's TCPStore server on the daemon's host, started as Daemon starts ddp-rendezvous."""

    def __init__(self, on, log):
        self.own_log = False
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([*on, paths.PY, "-c", STAND_IN, str(PORT)], stdout=out,
                                         stderr=subprocess.STDOUT)
        self.port = self._wait_listening(30.0)


class Agents:
    """The torchrun agents of one job, one per host, each logging to its own file."""

    def __init__(self, a, hosts, tag, nnodes, extra=(), worker_args=()):
        self.a, self.hosts, self.tag = a, hosts, tag
        self.nnodes, self.extra, self.worker_args = nnodes, list(extra), list(worker_args)
        self.procs, self.logs = {}, {}
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
                    and not k.startswith(("TORCHELASTIC_", "PET_", "DDPRUN_"))}
        self.env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def start(self, node):
        argv = [paths.PY, TORCHRUN, f"--nnodes={self.nnodes}", f"--nproc_per_node={NPROC}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={self.hosts.address(0)}:{PORT}", f"--rdzv_id={RUN_ID}",
                "--monitor_interval=0.1", *self.extra, WORKER, *self.worker_args]
        self.logs[node] = os.path.join(self.a.log_dir, f"{self.tag}-{self.hosts.names[node]}.log")
        with open(self.logs[node], "w") as log:
            self.procs[node] = subprocess.Popen(self.hosts.on(node, argv), stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True)

    def text(self, node):
        with open(self.logs[node], errors="replace") as f:
            return f.read()

    def lines(self):
        out = []
        for node in self.procs:
            for m in LINE.finditer(self.text(node)):
                out.append({"node": node, "host": m[1], "rank": int(m[2]), "world": int(m[3]),
                            "local_rank": int(m[4]), "group_rank": int(m[5]), "restarts": int(m[6]),
                            "first": m[7] == "1", "master": m[8], "agent_store": m[9], "sum": int(m[10])})
        return out

    def wait_lines(self, pred, count, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(map(pred, self.lines())) >= count:
                return True
            if any(p.poll() is not None for p in self.procs.values()):
                return False
            time.sleep(0.1)
        return False

    def wait(self, timeout):
        """{node: exit status or None (still running after `timeout`)}."""
        deadline = time.monotonic() + timeout
        codes = {}
        for node, p in self.procs.items():
            try:
                codes[node] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[node] = None
        return codes

    def stop(self):
        for node in self.procs:
            self.hosts.kill_all(node)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def tails(self, lines=25):
        return "\n".join(f"--- {self.hosts.names[n]} ({self.logs[n]}):\n" + "\n".join(self.text(n).splitlines()[-lines:])
                         for n in self.procs)


def check_world(lines, what, hosts, nodes):
    """The lines are one world of len(nodes) x NPROC: every rank once, the sum, ranks by group."""
    size = NPROC * len(nodes)
    ranks = sorted(x["rank"] for x in lines)
    ok = check(ranks == list(range(size)) and all(x["world"] == size for x in lines),
               f"{what}: ranks 0..{size - 1} each once with WORLD_SIZE {size} (got {ranks})")
    check(all(x["sum"] == size * (size + 1) // 2 for x in lines), f"{what}: gloo's all-reduce sums on every rank")
    check(all(x["rank"] == x["group_rank"] * NPROC + x["local_rank"] for x in lines),
          f"{what}: RANK = GROUP_RANK x {NPROC} + LOCAL_RANK")
    per_host = sorted(sum(x["host"] == hosts.names[n] for x in lines) for n in nodes)
    check(per_host == [NPROC] * len(nodes), f"{what}: {NPROC} workers on each host (got {per_host})")
    masters = {x["master"] for x in lines}
    check(len(masters) == 1, f"{what}: one MASTER_ADDR:MASTER_PORT for all ({sorted(masters)})")
    return ok


def run_job(a, hosts, tag, nnodes, extra=(), worker_args=()):
    """Starts both agents, waits for their end; (agents, exit statuses)."""
    job = Agents(a, hosts, tag, nnodes, extra, worker_args)
    for node in (1, 2):
        job.start(node)
    codes = job.wait(JOB_TIMEOUT)
    job.stop()
    return job, codes


def case_forms(a, hosts, store):
    for attempt, tag in enumerate(("forms", "same-id-again")):
        job, codes = run_job(a, hosts, tag, "2")
        if not check(codes == {1: 0, 2: 0}, f"{tag}: both torchrun agents exit 0 (got {codes})"):
            print(job.tails())
        lines = job.lines()
        check_world(lines, tag, hosts, [1, 2])
        check(all(x["agent_store"] == "False" for x in lines),
              f"{tag}: torch 1.13's c10d workers host their own store (TORCHELASTIC_USE_AGENT_STORE=False)")
        if attempt == 0:
            print(f"        workers' MASTER_ADDR:MASTER_PORT: {lines[0]['master'] if lines else '-'} "
                  f"(agent 0's host, not the daemon's {hosts.address(0)}:{PORT})")
            if a.store == "daemon":
                check_connections(store, hosts)


def check_connections(store, hosts):
    """The daemon names each torch connection once: no peer ADDRESS:PORT twice, every agent's."""
    with open(store.log, errors="replace") as f:
        peers = [(m[1], m[2]) for m in TORCH_CONNECTION.finditer(f.read())]
    check(len(peers) == len(set(peers)), f"daemon log: each torch connection named once ({len(peers)} lines)")
    check({hosts.address(1), hosts.address(2)} <= {p[0] for p in peers},
          "daemon log: torch connections from both agents' hosts")


def case_reform(a, hosts, store):
    marker = tempfile.mkdtemp(prefix="trd-fail-", dir=a.log_dir)
    job, codes = run_job(a, hosts, "reform", "2", ["--max_restarts=1"], ["--fail_once", marker])
    if not check(codes == {1: 0, 2: 0}, f"reform: both agents exit 0 after the re-formed round (got {codes})"):
        print(job.tails())
    lines = job.lines()
    check(os.path.exists(os.path.join(marker, "failed")), "reform: a worker of the first world failed")
    check_world([x for x in lines if x["first"]], "reform, first world", hosts, [1, 2])
    check_world([x for x in lines if not x["first"]], "reform, re-formed world", hosts, [1, 2])
    check(any(x["restarts"] == 1 for x in lines if not x["first"]),
          "reform: the failed node's workers run with TORCHELASTIC_RESTART_COUNT=1")


def case_join(a, hosts, store):
    job = Agents(a, hosts, "join", "1:2", ["--rdzv_conf=last_call_timeout=1"], ["--until_world", str(2 * NPROC)])
    job.start(1)
    alone = job.wait_lines(lambda x: x["world"] == NPROC, NPROC, JOB_TIMEOUT)
    check(alone, f"join: nodea alone forms a world of {NPROC}")
    job.start(2)
    codes = job.wait(JOB_TIMEOUT)
    job.stop()
    if not check(codes == {1: 0, 2: 0}, f"join: both agents exit 0 once nodeb joined (got {codes})"):
        print(job.tails())
    check_world([x for x in job.lines() if x["world"] == 2 * NPROC], "join, grown world", hosts, [1, 2])


def case_refused(a, hosts, store):
    job = Agents(a, hosts, "refused", "1", ["--rdzv_conf=read_timeout=10,join_timeout=20"])
    t0 = time.monotonic()
    job.start(1)
    code = job.wait(REFUSE_TIMEOUT)[1]
    secs = time.monotonic() - t0
    job.stop()
    text = job.text(1)
    check(code not in (None, 0), f"refused: torchrun exits non-zero (got {code}) within {REFUSE_TIMEOUT:g} s "
          f"({secs:.1f} s)")
    check(re.search(r"RendezvousConnectionError|C10d store|Connection reset|closed by peer|Broken pipe", text)
          is not None, "refused: torchrun names the store connection in its own error")
    check(not LINE.search(text), "refused: no worker ran")
    check(store.proc.poll() is None, "refused: the daemon still runs")
    if code in (None, 0) or failures:
        print(job.tails())


CASES = {"forms": case_forms, "reform": case_reform, "join": case_join, "refused": case_refused}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--store", choices=("daemon", "torch"), default="daemon")
    ap.add_argument("--log_dir", help="keep the logs here (default: a temporary folder, kept when a check fails)")
    a = ap.parse_args()
    paths.require_root("torchrun daemon test")
    paths.require("torchrun daemon test", paths.DAEMON, paths.PY)
    keep = a.log_dir is not None
    a.log_dir = a.log_dir or tempfile.mkdtemp(prefix="ddprun-torchrun-daemon-")
    os.makedirs(a.log_dir, exist_ok=True)
    hosts = RecipeHosts(types.SimpleNamespace(hosts=[["rdzv"], ["nodea"], ["nodeb"]]))
    try:
        log = os.path.join(a.log_dir, "store.log")
        if a.store == "torch":
            store = StandIn(hosts.on(0, []), log)
        else:
            admit = [] if a.case == "refused" else ["--torch-clients", RUN_ID]
            store = Daemon([f"--port={PORT}", *admit], on=hosts.on(0, []), log=log)
        try:
            CASES[a.case](a, hosts, store)
        finally:
            store.stop()
    finally:
        for i in range(hosts.count):
            hosts.kill_all(i)
        hosts.close()
    if failures:
        print(f"{len(failures)} check(s) failed; logs: {a.log_dir}")
        sys.exit(1)
    if not keep:
        shutil.rmtree(a.log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
