"""The benchmark behind scripts/bench/torchrun_daemon (see there).

Terms used below:
  store      where torchrun's c10d rendezvous lives: "daemon" (ddp-rendezvous --torch-clients
             on a host of its own, endpoint rdzv:PORT) or "torchrun" (torchrun's own TCPStore,
             hosted by node0's agent, endpoint node0:PORT)
  job        two torchrun 2.15 agents (node0, node1), --nnodes=2 --nproc_per_node=2
             --max_restarts=1, running the test's worker (tests/system/torchrun_daemon/worker.py)
             with --fail_once: the first world's last rank fails once, the round re-forms
  ready line what a worker prints after init_process_group and one all-reduce (its stamp t)
  form       from the last agent's start to the latest ready stamp of the first world
  re-form    from the failing worker's stamp to the latest ready stamp of the second world
  done       from the last agent's start to both agents' exit 0
"""
import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

from harness import paths
from harness.procs import Daemon
from harness.runs import figures, interleaved
from recipes_bench import RecipeHosts, torch2_env

WORKER = os.path.join(paths.ROOT, "tests", "system", "torchrun_daemon", "worker.py")
PORT = 29400
RUN_ID = "trd-bench"
STORES = ("daemon", "torchrun")
# Two workers' lines can share one line of the agent's output (one's newline after the
# other's text), so every field is matched without reaching past its own: t has 6 decimals.
READY = re.compile(r"TRD_WORKER host=(\S+) rank=(\d+) world=(\d+) local_rank=\d+ group_rank=\d+ restarts=\d+ "
                   r"first=(\d) master=\S+ agent_store=\w+ sum=\d+ t=(\d+\.\d{6})")
FAIL = re.compile(r"TRD_FAIL t=(\d+\.\d{6})")


class JobFailed(Exception):
    pass


def say(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run_job(a, hosts, store, env, tag):
    """One job on fresh agents; {"form", "reform", "done"} in seconds."""
    endpoint = f"rdzv:{PORT}" if store == "daemon" else f"node0:{PORT}"
    marker = tempfile.mkdtemp(prefix="fail-", dir=a.log_dir)
    logs, procs = {}, {}
    try:
        for node in (1, 2):
            argv = [a.torchrun, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                    f"--rdzv_endpoint={endpoint}", f"--rdzv_id={RUN_ID}", "--max_restarts=1",
                    "--monitor_interval=0.1", WORKER, "--fail_once", marker]
            logs[node] = os.path.join(a.log_dir, f"{tag}-{hosts.names[node]}.log")
            with open(logs[node], "w") as log:
                t0 = time.time()
                procs[node] = subprocess.Popen(hosts.on(node, argv), stdout=log, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True)
        deadline = time.monotonic() + a.timeout
        codes = {}
        for node, p in procs.items():
            try:
                codes[node] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[node] = None
        t_done = time.time()
        text = "".join(open(logs[n], errors="replace").read() for n in procs)
        if codes != {1: 0, 2: 0}:
            tails = "\n".join(f"--- {logs[n]}:\n" + "\n".join(open(logs[n], errors="replace").read().splitlines()[-12:])
                              for n in procs)
            raise JobFailed(f"agents ended with {codes}\n{tails}")
        ready = [(int(m[2]), int(m[3]), m[4] == "1", float(m[5])) for m in READY.finditer(text)]
        fail = [float(m[1]) for m in FAIL.finditer(text)]
        first = [r for r in ready if r[2]]
        second = [r for r in ready if not r[2]]
        for name, world in (("first", first), ("second", second)):
            if sorted(r[0] for r in world) != [0, 1, 2, 3] or any(r[1] != 4 for r in world):
                raise JobFailed(f"the {name} world is not ranks 0..3 of 4: {world}")
        if len(fail) != 1:
            raise JobFailed(f"expected one failed worker, saw {len(fail)}")
        return {"form": max(r[3] for r in first) - t0, "reform": max(r[3] for r in second) - fail[0],
                "done": t_done - t0}
    finally:
        for node in procs:
            hosts.kill_all(node)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description="torchrun 2.15's c10d rendezvous through ddp-rendezvous beside "
                                 "torchrun's own store: form, re-form and whole-job times")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stores", default=",".join(STORES), help="comma list of daemon, torchrun")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one job may take")
    ap.add_argument("--share_store", action="store_true",
                    help="leave torch's shared rendezvous TCPStore on (default: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                    "for both stores, torch's documented opt-out that re-forms reliably)")
    ap.add_argument("--log_dir", help="keep the logs here (default: a temporary folder, kept when a job fails)")
    a = ap.parse_args()
    stores = [s for s in a.stores.split(",") if s]
    if a.runs < 1 or not stores or any(s not in STORES for s in stores):
        sys.exit(f"torchrun_daemon bench: bad arguments (stores: {', '.join(STORES)}; --runs >= 1)")
    paths.require_root("torchrun_daemon bench")
    paths.require("torchrun_daemon bench", paths.DAEMON)
    paths.require_peers("torchrun_daemon bench", paths.TORCH2)
    t2 = torch2_env()  # installs torch 2.15 on first use
    a.torchrun = os.path.join(paths.TORCH2_VENV, "bin", "torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
           and not k.startswith(("TORCHELASTIC_", "PET_", "DDPRUN_"))}
    env.update(PYTHON_EXEC=t2["PYTHON_EXEC"], LD_LIBRARY_PATH=t2["LD_LIBRARY_PATH"], OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    if not a.share_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    keep = a.log_dir is not None
    a.log_dir = a.log_dir or tempfile.mkdtemp(prefix="ddprun-torchrun-daemon-bench-")
    os.makedirs(a.log_dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("torchrun_daemon bench: terminated"))

    hosts = RecipeHosts(types.SimpleNamespace(hosts=[["rdzv"], ["node0"], ["node1"]]))
    results, failures = {}, {}
    try:
        # One daemon for every job of the run, all under the same id: each job's namespace must
        # be gone with its last connection, or the next job would find torch's closed rendezvous.
        daemon = contextlib.nullcontext()
        if "daemon" in stores:
            daemon = Daemon([f"--port={PORT}", "--torch-clients", RUN_ID], on=hosts.on(0, []),
                            log=os.path.join(a.log_dir, "ddp-rendezvous.log"))
        with daemon:
            for i, order in interleaved(a.runs, stores, alternate=True):
                for store in order:
                    if store in failures:
                        continue
                    try:
                        r = run_job(a, hosts, store, env, f"{i + 1:02d}-{store}")
                    except JobFailed as e:
                        failures[store] = str(e)
                        keep = True
                        say(f"run {i + 1}/{a.runs} {store}: FAILED: {str(e).splitlines()[0]}")
                        continue
                    for k, v in r.items():
                        results.setdefault((store, k), []).append(v)
                    say(f"run {i + 1}/{a.runs} {store}: form {r['form']:.3f} s, re-form {r['reform']:.3f} s, "
                        f"done {r['done']:.3f} s")
    finally:
        for i in range(hosts.count):
            hosts.kill_all(i)
        hosts.close()

    share = "shared" if a.share_store else "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    print(f"\ntorchrun 2.15, c10d, 2 hosts x 2 workers (gloo), --max_restarts=1, one worker failing once; "
          f"median of {a.runs} runs (min-max); rendezvous TCPStore {share}")
    print(f"{'store':<34} {'form':>20} {'re-form':>20} {'whole job':>20}")
    for store in stores:
        cells = []
        for k in ("form", "reform", "done"):
            v = results.get((store, k))
            cells.append("FAILED" if not v else "{0.median:.3f}s ({0.min:.2f}-{0.max:.2f})".format(figures(v)))
        title = "ddp-rendezvous (rdzv:29400)" if store == "daemon" else "torchrun's own (node0:29400)"
        print(f"{title:<34} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20}")
    if len(stores) == 2 and all((s, "form") in results for s in stores):
        ratio = {k: figures(results[("daemon", k)]).median / figures(results[("torchrun", k)]).median
                 for k in ("form", "reform", "done")}
        print("ratio daemon/torchrun: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))
    for store, text in failures.items():
        print(f"{store} FAILED: {text}")
    if keep:
        print(f"logs: {a.log_dir}")
    else:
        shutil.rmtree(a.log_dir, ignore_errors=True)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
