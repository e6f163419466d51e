"""The benchmark behind scripts/bench/signals (see there for usage).

Each phase starts a ddprun that waits for something that never comes (or a worker that
is stopped), waits until ddprun says what it waits for (DDP_WAIT_NOTICE_SEC=1, so the
notice comes within a second), waits a random fraction of a second more (so the signal
lands anywhere in a wait's slice), sends the signal and times ddprun's exit. A phase's
figure is the median over the runs; every run checks the exit status."""
import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from harness import paths
from harness.procs import Daemon, bench_env
from harness.runs import figures, interleaved

TOKEN = "signals-bench"
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watched:
    """A process whose stderr is read line by line on a thread; `saw(text)` waits for a line."""

    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def saw(self, text, limit=30):
        with self.cond:
            ok = self.cond.wait_for(lambda: any(text in ln for ln in self.lines) or self.proc.poll() is not None,
                                    timeout=limit)
            found = any(text in ln for ln in self.lines)
        if not ok or not found:
            self.kill()
            sys.exit(f"signals bench: no line with {text!r} in {limit} s:\n{''.join(self.lines)[-3000:]}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def time_exit(target, sig, limit=60):
    """Sends `sig` to the watched ddprun and returns the seconds until it exited; checks the status."""
    time.sleep(random.uniform(0, 0.6))
    start = time.perf_counter()
    target.proc.send_signal(sig)
    try:
        status = target.proc.wait(limit)
    except subprocess.TimeoutExpired:
        target.kill()
        sys.exit(f"signals bench: ddprun did not exit within {limit} s of {sig.name}")
    took = time.perf_counter() - start
    if status != STATUS[sig]:
        sys.exit(f"signals bench: ddprun exited with {status}, not {STATUS[sig]}, after {sig.name}:\n"
                 f"{''.join(target.lines)[-3000:]}")
    return took


def ddprun(*args):
    return [paths.DDPRUN, *args]


def phase_connecting(env, sig, daemon):
    port = free_port()  # nothing listens there
    t = Watched(ddprun("--nnodes=2", "--rdzv_id=sig-conn", f"--rdzv_endpoint=127.0.0.1:{port}",
                       "--rdzv_conf=is_host=false", "/bin/true"), env)
    t.saw("still waiting for the store at")
    return time_exit(t, sig)


def phase_joining(env, sig, daemon):
    # Node 1 of a fixed job on a daemon, node 0 never comes: it waits for node 0's run id.
    run_id = f"sig-join-{random.getrandbits(32):x}"
    t = Watched(ddprun("--nnodes=2", "--node_rank=1", f"--rdzv_id={run_id}",
                       f"--rdzv_endpoint=127.0.0.1:{daemon.port}", "/bin/true"), env)
    t.saw("still waiting for node 0 to join")
    return time_exit(t, sig)


def phase_nodes_fixed(env, sig, daemon):
    # Node 0 hosting its store, node 1 never comes.
    t = Watched(ddprun("--nnodes=2", "--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                       "/bin/true"), env)
    t.saw("still waiting for node rank(s) 1 of 2 to join")
    return time_exit(t, sig)


def phase_nodes_elastic(env, sig, daemon):
    run_id = f"sig-el-{random.getrandbits(32):x}"
    t = Watched(ddprun("--nnodes=2:3", f"--rdzv_id={run_id}", f"--rdzv_endpoint=127.0.0.1:{daemon.port}",
                       "/bin/true"), env)
    t.saw("to form:")
    return time_exit(t, sig)


def phase_exit_barrier(env, sig, daemon):
    # Node 0's worker ends at once; node 1's sleeps, so node 0 waits in the exit barrier.
    port = free_port()
    common = ["--nnodes=2", "--master_addr=127.0.0.1", f"--master_port={port}"]
    other = Watched(ddprun(*common, "--node_rank=1", "/bin/sleep", "120"), env)
    try:
        t = Watched(ddprun(*common, "--node_rank=0", "/bin/true"), env)
        t.saw("still waiting for node rank(s) 1 to finish")
        return time_exit(t, sig)
    finally:
        other.kill()


def worker_pids(pid):
    """ddprun's children that run the worker program (not its guard)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(x) for x in f.read().split()]
    out = []
    for k in kids:
        try:
            with open(f"/proc/{k}/comm") as f:
                if f.read().strip() == "sleep":
                    out.append(k)
        except OSError:
            pass
    return out


def phase_stopped_worker(env, sig, daemon):
    # Two workers, one SIGSTOPped; the grace period (30 s) must not be what ends it.
    t = Watched(ddprun("--nproc_per_node=2", "--standalone", "--grace_period=30", "/bin/sleep", "120"), env)
    deadline = time.monotonic() + 30
    while len(pids := worker_pids(t.proc.pid)) < 2:
        if time.monotonic() > deadline or t.proc.poll() is not None:
            t.kill()
            sys.exit("signals bench: the two workers did not start")
        time.sleep(0.02)
    os.kill(pids[-1], signal.SIGSTOP)
    while True:  # until /proc says it is stopped
        with open(f"/proc/{pids[-1]}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                break
        time.sleep(0.01)
    took = time_exit(t, sig)
    if any(os.path.exists(f"/proc/{p}") for p in pids):
        sys.exit("signals bench: a worker outlived ddprun")
    if not any("was stopped (SIGSTOP); continued it" in ln for ln in t.lines):
        sys.exit("signals bench: ddprun did not say it continued the stopped worker:\n" + "".join(t.lines)[-3000:])
    return took


class SshPhase:
    """A --hostfile launch from a login node to one sshd host and one address where nothing
    answers: the login node's neighbour entry for it names a MAC no host has, so ssh's
    connect hangs (until its ConnectTimeout) and the launch waits for that agent."""

    def __init__(self):
        from harness.ssh_hosts import SshHosts
        self.hosts = SshHosts(1)
        self.dir = tempfile.mkdtemp(prefix="ddprun-bench-signals-")
        self.hostfile = os.path.join(self.dir, "hosts")
        unreachable = self.hosts.address(0).rsplit(".", 1)[0] + ".200"
        subprocess.run(self.hosts.on(self.hosts.login, ["ip", "neigh", "replace", unreachable, "lladdr",
                                                        "02:00:00:00:00:c8", "dev", "eth0", "nud", "permanent"]),
                       check=True)
        with open(self.hostfile, "w") as f:
            f.write(f"{self.hosts.address(0)} slots=1\n{unreachable} slots=1\n")

    def __call__(self, env, sig, daemon):
        env = dict(env, DDPRUN_SSH=self.hosts.ssh_command())
        t = Watched(self.hosts.on(self.hosts.login, ddprun("--hostfile", self.hostfile, "/bin/sleep", "120")), env)
        t.saw("still waiting for the agent to start on")
        took = time_exit(t, sig)
        self.hosts.kill_job_processes()
        return took

    def close(self):
        self.hosts.close()
        os.unlink(self.hostfile)
        os.rmdir(self.dir)


PHASES = {
    "connecting": phase_connecting,
    "joining": phase_joining,
    "nodes_fixed": phase_nodes_fixed,
    "nodes_elastic": phase_nodes_elastic,
    "exit_barrier": phase_exit_barrier,
    "ssh": None,  # made on use (root: network namespaces and sshd)
    "stopped_worker": phase_stopped_worker,
}
TARGET = {"stopped_worker": 2.0}  # seconds; every other phase: 1 s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of: " + ", ".join(PHASES))
    ap.add_argument("--signal", default="INT", choices=["INT", "TERM", "HUP"],
                    help="the signal sent in every phase but stopped_worker (which gets TERM)")
    opts = ap.parse_args()
    phases = [p for p in opts.phases.split(",") if p]
    for p in phases:
        if p not in PHASES:
            sys.exit(f"signals bench: unknown phase {p!r} (known: {', '.join(PHASES)})")
    paths.require("signals bench", paths.DDPRUN, paths.DAEMON)
    if "ssh" in phases:
        paths.require_root("signals bench", "the ssh phase's network namespaces; --phases can leave it out")
    sig = signal.Signals["SIG" + opts.signal]
    env = bench_env(DDP_WAIT_NOTICE_SEC="1", DDPRUN_TOKEN=TOKEN)
    token_file = tempfile.NamedTemporaryFile("w", prefix="ddprun-bench-signals-token-")
    token_file.write(TOKEN + "\n")
    token_file.flush()
    ssh = SshPhase() if "ssh" in phases else None
    times = {p: [] for p in phases}
    try:
        with Daemon(["--host=127.0.0.1", "--port=0", "--token-file", token_file.name], env=env) as daemon:
            for _, order in interleaved(opts.runs, phases, alternate=True, progress=True):
                for p in order:
                    run = ssh if p == "ssh" else PHASES[p]
                    times[p].append(run(env, signal.SIGTERM if p == "stopped_worker" else sig, daemon))
    finally:
        if ssh:
            ssh.close()
    print(f"\nfrom the signal to ddprun's exit ({opts.runs} runs each; stopped_worker: SIGTERM with "
          f"--grace_period 30, the others: SIG{opts.signal})")
    print(f"{'phase':<16} {'median s':>9} {'min s':>7} {'max s':>7}  target")
    for p in phases:
        f = figures(times[p])
        target = TARGET.get(p, 1.0)
        print(f"{p:<16} {f.median:>9.3f} {f.min:>7.3f} {f.max:>7.3f}  <= {target:g} s"
              f"{'' if f.median <= target else '  MISSED'}")


if __name__ == "__main__":
    main()
