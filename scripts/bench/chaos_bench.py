"""The soak behind scripts/bench/chaos (see there; the checks and their terms are in
chaos_checks.py).

Terms used below:
  host       a network namespace (harness.hosts); hosts 0..3 run the job's agents, host 4
             runs the ddp-rendezvous daemon alone, so no fault on a job host touches it
  agent      one `ddprun --nnodes MIN:4` on a host; a job is the agents of one --rdzv_id
  job        one elastic Fashion-MNIST training of --epochs epochs, checkpointing after each
             epoch; when one is over the next starts, until --duration has passed
  fault      one injection, chosen and timed by the seeded generator: see FAULTS
  restore    the second half of a timed fault (SIGCONT, link up), due at its end
  soak time  seconds since the soak started; every line, fault and event is stamped with it
"""
import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import chaos_checks as checks
from harness import paths
from harness.hosts import Hosts

JOB_HOSTS, DAEMON_HOST, PORT = 4, 4, 29400
FAULTS = {  # kind: (weight, what it does)
    "worker_kill": (3, "SIGKILL of one worker"),
    "agent_kill": (2, "SIGKILL of one node's ddprun (its workers are left to ddprun's orphan guard)"),
    "host_kill": (1, "SIGKILL of every process on one host at once (the host dies)"),
    "stop_short": (2, "SIGSTOP of one worker for less than the heartbeat, then SIGCONT"),
    "stop_long": (2, "SIGSTOP of one worker for more than the heartbeat (and the stall timeout), then SIGCONT"),
    "link_cut": (2, "one host's link down for 0.3 to 3 heartbeats, then up"),
    "join": (4, "a ddprun started on a host that runs none: a node joins"),
    "daemon_hup": (1, "SIGHUP to ddp-rendezvous (re-reads its token file)"),
}


class Agent:
    """One ddprun on a host; its output, stamped with soak time, goes to its log file and
    to the job's timeline."""

    def __init__(self, soak, job, host, hint, joined):
        self.host, self.hint, self.joined = host, hint, joined
        self.faulted = None  # what the soak did to it ("agent_kill", "link_cut", ...)
        self.stopped_by_soak = False
        self.text = []
        self.log = os.path.join(job.dir, f"host{host}-{len(job.agents)}.log")
        self.proc = subprocess.Popen(soak.hosts.on(host, job.argv(hint)), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=soak.env, text=True, errors="replace")
        self.started = soak.now()
        self.reader = threading.Thread(target=self._read, args=(soak, job), daemon=True)
        self.reader.start()

    def _read(self, soak, job):
        source = f"host {self.host} ddprun"
        with open(self.log, "w") as log:
            for line in self.proc.stdout:
                t, line = soak.now(), line.rstrip("\n")
                self.text.append(line)
                log.write(f"{t:9.2f} {line}\n")
                log.flush()
                job.timeline.line(t, source, line)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def output(self):
        self.reader.join(timeout=5)
        return "\n".join(self.text)


class Job:
    def __init__(self, soak, k):
        a = soak.a
        self.soak, self.k = soak, k
        self.run_id = f"chaos{a.seed}-{k}"
        self.dir = os.path.join(a.log_dir, f"job{k}")
        os.makedirs(self.dir, exist_ok=True)
        self.timeline = checks.Timeline()
        self.agents = []
        self.begin = soak.now()
        self.end = None
        self.result_seen_at = None

    def argv(self, hint):
        a, s = self.soak.a, self.soak
        return [paths.DDPRUN, f"--nnodes={a.min_nodes}:{JOB_HOSTS}", f"--node_rank={hint}",
                f"--nproc_per_node={a.nproc_per_node}", f"--rdzv_id={self.run_id}",
                f"--rdzv_endpoint={s.hosts.address(DAEMON_HOST)}:{PORT}", f"--rdzv_token_file={s.token}",
                "--rdzv_conf=last_call_timeout=1", f"--join_timeout={a.join_timeout:g}",
                f"--heartbeat_timeout={a.heartbeat_timeout:g}", f"--grace_period={a.grace_period:g}",
                f"--stall_timeout={a.stall_timeout:g}", f"--max_restarts={a.max_restarts}",
                paths.FASHION_MNIST, "--checkpoint", os.path.join(self.dir, "fm.ckpt"), "--epochs", str(a.epochs)]

    def start(self, host, hint, joined=False):
        agent = Agent(self.soak, self, host, hint, joined)
        self.agents.append(agent)
        return agent

    def live(self):
        return [x for x in self.agents if x.alive()]

    def on(self, host):
        return [x for x in self.live() if x.host == host]

    def over(self):
        return not self.live()

    def output(self):
        return "\n".join(x.output() for x in self.agents)


class Soak:
    def __init__(self, a, hosts):
        self.a, self.hosts = a, hosts
        self.rng = random.Random(a.seed)
        self.t0 = time.monotonic()
        self.token = os.path.join(a.log_dir, "token")
        with open(self.token, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.inodes = [checks.netns_inode(hosts.ns(i)) for i in range(JOB_HOSTS)]
        self.faults = Counter()
        self.fault_log = open(os.path.join(a.log_dir, "faults.log"), "w")
        self.pending = []  # (due soak time, description, fn): restores and checks
        self.cut = set()  # hosts whose link is down
        self.stopped = {}  # worker pid -> host, while SIGSTOPped
        self.checking = set()  # hosts whose killed ddprun's processes are yet to be checked
        self.orphans = []  # (job, where, description)
        self.jobs = []  # finished jobs' verdicts
        self.hangs = []  # (job, text)
        self.late_joiners = 0
        self.job = None
        self.poller_stop = threading.Event()
        self.daemon = None

    def now(self):
        return time.monotonic() - self.t0

    def say(self, text):
        line = f"[{self.now():8.2f} s] {text}"
        print(line, flush=True)
        self.fault_log.write(line + "\n")
        self.fault_log.flush()

    # -- the daemon and the status poller ---------------------------------------------

    def start_daemon(self):
        log = open(os.path.join(self.a.log_dir, "ddp-rendezvous.log"), "w")
        self.daemon = subprocess.Popen(self.hosts.on(DAEMON_HOST, [
            paths.DAEMON, f"--port={PORT}", f"--heartbeat-timeout={self.a.heartbeat_timeout:g}",
            "--token-file", self.token]), stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(log.name, errors="replace") as f:
                if "listening on" in f.read():
                    return
            if self.daemon.poll() is not None:
                break
            time.sleep(0.05)
        sys.exit(f"chaos: ddp-rendezvous did not start (its log: {log.name})")

    def poll_status(self):
        """Reads `ddprun status --json` of the current job every --poll seconds; a reading
        that differs from the last is progress on the job's timeline."""
        last = None
        log = open(os.path.join(self.a.log_dir, "status.log"), "w")  # failed and slow readings
        while not self.poller_stop.wait(self.a.poll):
            job = self.job
            if job is None or job.end is not None:
                continue
            argv = self.hosts.on(DAEMON_HOST, [paths.DDPRUN, "status", f"--run_id={job.run_id}", "--json"])
            began, reading, why = self.now(), None, ""
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=self.env)
                reading = json.loads(p.stdout) if p.returncode == 0 else None
                why = f"status {p.returncode}: {p.stderr.strip()[:200]}"
            except (subprocess.TimeoutExpired, ValueError) as e:
                why = str(e)[:200]
            took = self.now() - began
            if reading is None or took > 2:
                log.write(f"{began:9.2f} job {job.k} took {took:.2f} s {'' if reading else why}\n")
                log.flush()
            if reading is None:
                continue
            sig = (job.run_id, checks.status_signature(reading))
            if sig != last:
                last = sig
                calls = ", ".join(f"{r.get('rank')}:{r.get('call')}" for r in reading.get("ranks", []))
                job.timeline.add(self.now(), "progress", "status", f"attempt {reading.get('attempt')}: {calls}")

    # -- jobs ---------------------------------------------------------------------------

    def start_job(self):
        self.job = Job(self, len(self.jobs) + 1)
        self.say(f"job {self.job.k} ({self.job.run_id}) starts on hosts 0-{JOB_HOSTS - 1}")
        for h in range(JOB_HOSTS):
            self.job.start(h, h)

    def members(self):
        """Hosts of the current job whose agent lives and whose link is up."""
        return sorted({x.host for x in self.job.live() if x.host not in self.cut})

    def free_hosts(self):
        return [h for h in range(JOB_HOSTS) if h not in self.cut and h not in self.checking and not self.job.on(h)
                and not checks.live_in(self.inodes[h])]

    def workers(self):
        """(host, pid) of every running worker of the current job not stopped by the soak."""
        return [(x.host, w) for x in self.job.live() if x.host not in self.cut
                for w in checks.workers_of(x.pid) if w not in self.stopped]

    def stop_late_joiners(self):
        """After rank 0's RESULT, agents with no worker wait for a job that is over (a
        joiner that came too late, under the same --rdzv_id): the soak stops them."""
        job = self.job
        if job.result_seen_at is None:
            if any(checks.RESULT.search(line) for x in job.agents for line in x.text[-5:]):
                job.result_seen_at = self.now()
            return
        if self.now() - job.result_seen_at < self.a.exit_barrier_slack:
            return
        for x in job.live():
            if not checks.workers_of(x.pid) and not x.stopped_by_soak:
                x.stopped_by_soak = True
                self.late_joiners += 1
                self.say(f"job {job.k}: host {x.host}'s ddprun (pid {x.pid}) still runs "
                         f"{self.now() - job.result_seen_at:.0f} s after the job's RESULT, with no worker: SIGTERM")
                x.proc.send_signal(signal.SIGTERM)
                self.later(self.a.grace_period + 5, f"host {x.host} late joiner gone", lambda x=x: self.force_gone(x))

    def force_gone(self, x):
        if x.alive():
            self.hangs.append((self.job.k, f"host {x.host}'s ddprun (pid {x.pid}) ignored SIGTERM for "
                                           f"{self.a.grace_period + 5:g} s"))
            self.say(f"HANG: host {x.host}'s ddprun ignored SIGTERM; SIGKILL")
            x.proc.kill()

    def finish_job(self, ended):
        """Checks the job that is over (or, `ended` False, did not end in time) and records
        its verdict."""
        job, a = self.job, self.a
        job.end = self.now()
        if not ended:
            self.hangs.append((job.k, f"job {job.k} did not end within {a.finish_timeout:g} s after the faults stopped"))
            self.say(f"HANG: job {job.k} still runs {a.finish_timeout:g} s after the last fault; killing it")
            for x in job.live():
                self.hosts.kill_all(x.host)
        for h in range(JOB_HOSTS):
            for d in checks.reap_orphans(self.inodes[h], settle=3.0):
                self.orphans.append((job.k, f"host {h} after the job", d))
                self.say(f"ORPHAN: job {job.k}, host {h}: {d}")
        text = job.output()
        acc = checks.accuracy(text)
        unharmed = [x for x in job.agents if x.faulted is None and not x.stopped_by_soak]
        statuses = [x.proc.returncode for x in unharmed]
        completed = acc is not None and all(s == 0 for s in statuses) and bool(statuses)
        causes = [checks.named_root_cause(x.output()) for x in unharmed if x.proc.returncode != 0]
        cause = None if completed or not causes or None in causes else causes[0]
        ws = checks.waits(job.timeline, job.begin, job.end, a.wait_bound, a.report_period + 5)
        longest = checks.longest_wait(ws)
        for w in ws:
            if w.hang:
                self.hangs.append((job.k, w.describe()))
                self.say(f"HANG in job {job.k}: {w.describe()}")
        verdict = {"job": job.k, "run_id": job.run_id, "completed": completed, "accuracy": acc, "cause": cause,
                   "statuses": statuses, "longest": longest, "seconds": job.end - job.begin,
                   "agents": len(job.agents)}
        self.jobs.append(verdict)
        what = (f"completed, accuracy {acc * 100:.2f} %" if completed else
                f"ended without finishing: {cause}" if cause else
                f"ended WITHOUT A NAMED ROOT CAUSE (exit statuses {statuses}, RESULT {'seen' if acc else 'not seen'})")
        self.say(f"job {job.k} over after {job.end - job.begin:.1f} s, {len(job.agents)} agents: {what}; "
                 f"longest wait {longest.seconds if longest else 0:.1f} s")
        with open(os.path.join(job.dir, "timeline.txt"), "w") as f:
            for e in job.timeline.sorted():
                f.write(f"{e[0]:9.2f} {e[1]:<8} {e[2]}: {e[3]}\n")

    # -- faults -------------------------------------------------------------------------

    def later(self, delay, what, fn):
        self.pending.append((self.now() + delay, what, fn))

    def run_pending(self, everything=False):
        now = self.now()
        due = [p for p in self.pending if everything or p[0] <= now]
        self.pending = [p for p in self.pending if p not in due]
        for _, _, fn in sorted(due, key=lambda p: p[0]):
            fn()

    def eligible(self):
        members, kinds = self.members(), []
        workers = self.workers()
        above_min = len(members) > self.a.min_nodes
        if workers:
            kinds += ["worker_kill"]
            if not self.stopped:
                kinds += ["stop_short", "stop_long"]
        if above_min:
            kinds += ["agent_kill", "host_kill"]
            if not self.cut:
                kinds += ["link_cut"]
        if len(self.job.live()) < JOB_HOSTS and self.free_hosts() and self.job.result_seen_at is None:
            kinds += ["join"]
        kinds += ["daemon_hup"]
        return kinds

    def inject(self):
        kinds = self.eligible()
        # Every fault takes the same three draws, whatever it turns out to be: a replay's
        # generator stays in step with the first run's even where the job's state (which
        # kinds are possible, which victims exist) differs at that moment.
        u_kind, u_pick, u_secs = self.rng.random(), self.rng.random(), self.rng.random()
        kind = self.rng_choices(kinds, [FAULTS[k][0] for k in kinds], u_kind)

        def pick(options):
            return sorted(options)[int(u_pick * len(options))]

        self.faults[kind] += 1
        n = sum(self.faults.values())
        job, hb = self.job, self.a.heartbeat_timeout
        prefix = f"fault {n}: {kind}"
        if kind in ("worker_kill", "stop_short", "stop_long"):
            host, pid = pick(self.workers())
            if kind == "worker_kill":
                self.say(f"{prefix}: host {host} worker pid {pid} (job {job.k})")
                self.signal(pid, signal.SIGKILL)
                return
            secs = hb * (0.3 + 0.5 * u_secs if kind == "stop_short" else 1.5 + 1.5 * u_secs)
            self.say(f"{prefix}: host {host} worker pid {pid} stopped for {secs:.1f} s (job {job.k})")
            self.stopped[pid] = host
            self.signal(pid, signal.SIGSTOP)
            self.later(secs, f"SIGCONT {pid}", lambda: self.cont(pid))
        elif kind in ("agent_kill", "host_kill", "link_cut"):
            host = pick(self.members())
            agent = job.on(host)[0]
            agent.faulted = kind
            if kind == "agent_kill":
                left = checks.descendants(agent.pid)
                self.say(f"{prefix}: host {host}'s ddprun pid {agent.pid} (job {job.k}; its processes {left})")
                self.signal(agent.pid, signal.SIGKILL)
                self.checking.add(host)
                self.later(self.a.orphan_settle, f"host {host} empty", lambda: self.check_gone(host, job, left))
            elif kind == "host_kill":
                self.say(f"{prefix}: every process on host {host} (job {job.k})")
                self.hosts.kill_all(host)
            else:
                secs = hb * (0.3 + 2.7 * u_secs)
                self.say(f"{prefix}: host {host}'s link down for {secs:.1f} s (job {job.k})")
                self.cut.add(host)
                self.hosts.set_link(host, "down")
                self.later(secs, f"host {host} link up", lambda: self.link_up(host))
        elif kind == "join":
            host = pick(self.free_hosts())
            agent = job.start(host, host, joined=True)
            self.say(f"{prefix}: ddprun pid {agent.pid} joins job {job.k} on host {host}")
        else:
            self.say(f"{prefix}: ddp-rendezvous pid {self.daemon.pid}")
            self.daemon.send_signal(signal.SIGHUP)

    @staticmethod
    def rng_choices(options, weights, u):
        """The option that the uniform draw `u` falls on, by weight."""
        edge = u * sum(weights)
        for option, w in zip(options, weights):
            edge -= w
            if edge < 0:
                return option
        return options[-1]

    def signal(self, pid, sig):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def cont(self, pid):
        if self.stopped.pop(pid, None) is not None:
            state = checks.process_state(pid)
            self.say(f"restore: SIGCONT worker pid {pid} ({'gone' if state is None else 'state ' + state})")
            self.signal(pid, signal.SIGCONT)

    def link_up(self, host):
        if host in self.cut:
            self.cut.discard(host)
            self.hosts.set_link(host, "up")
            self.say(f"restore: host {host}'s link up")

    def check_gone(self, host, job, pids):
        """After a node's ddprun was SIGKILLed, none of its processes may stay."""
        self.checking.discard(host)
        for d in checks.reap(pids):
            self.orphans.append((job.k, f"host {host}, {self.a.orphan_settle:g} s after its ddprun's SIGKILL", d))
            self.say(f"ORPHAN: job {job.k}, host {host}, {self.a.orphan_settle:g} s after its ddprun was killed: {d}")

    # -- the soak -----------------------------------------------------------------------

    def run(self):
        a = self.a
        self.start_daemon()
        poller = threading.Thread(target=self.poll_status, daemon=True)
        poller.start()
        self.start_job()
        next_fault = self.now() + a.warmup
        while self.now() < a.duration:
            self.run_pending()
            self.stop_late_joiners()
            if self.job.over():
                self.finish_job(True)
                self.start_job()
                next_fault = max(next_fault, self.now() + a.warmup)
            elif self.now() >= next_fault:
                self.inject()
                next_fault = self.now() + self.rng.uniform(a.min_gap, a.max_gap)
            time.sleep(0.05)
        self.say(f"{a.duration:g} s passed: no more faults; restoring links and stopped workers, "
                 f"waiting up to {a.finish_timeout:g} s for job {self.job.k} to end")
        self.run_pending(everything=True)
        deadline = self.now() + a.finish_timeout
        while not self.job.over() and self.now() < deadline:
            self.run_pending()
            self.stop_late_joiners()
            time.sleep(0.1)
        self.finish_job(self.job.over())
        self.run_pending(everything=True)
        self.poller_stop.set()
        poller.join(timeout=15)


def replay_command(a):
    """This run's command line with its seed and without its log folder."""
    argv, skip = [], False
    for word in sys.argv[1:]:
        if skip:
            skip = False
        elif word in ("--seed", "--log_dir"):
            skip = True
        elif not word.startswith(("--seed=", "--log_dir=")):
            argv.append(word)
    return " ".join(["scripts/bench/chaos", "--seed", str(a.seed)] + argv)


def summary(a, soak):
    print()
    print(f"chaos soak: seed {a.seed}, {a.duration:g} s of faults every {a.min_gap:g}-{a.max_gap:g} s; "
          f"{JOB_HOSTS} hosts at --nnodes {a.min_nodes}:{JOB_HOSTS}, {a.nproc_per_node} worker(s) each, "
          f"Fashion-MNIST {a.epochs} epochs per job; heartbeat {a.heartbeat_timeout:g} s, stall timeout "
          f"{a.stall_timeout:g} s, grace {a.grace_period:g} s; daemon on host {DAEMON_HOST}")
    total = sum(soak.faults.values())
    print(f"faults injected: {total} (" + ", ".join(f"{k} {soak.faults[k]}" for k in FAULTS) + ")")
    done = [j for j in soak.jobs if j["completed"]]
    caused = [j for j in soak.jobs if not j["completed"] and j["cause"]]
    silent = [j for j in soak.jobs if not j["completed"] and not j["cause"]]
    print(f"jobs: {len(soak.jobs)}, completed {len(done)}, ended with a named root cause {len(caused)}, "
          f"ended without one {len(silent)}")
    print(f"  {'job':>4} {'seconds':>8} {'agents':>6}  {'longest wait':>12}  verdict")
    for j in soak.jobs:
        verdict = (f"completed, accuracy {j['accuracy'] * 100:.2f} %" if j["completed"] else
                   j["cause"] or "NO NAMED ROOT CAUSE")
        wait = f"{j['longest'].seconds:.1f} s" if j["longest"] else "-"
        print(f"  {j['job']:>4} {j['seconds']:>8.1f} {j['agents']:>6}  {wait:>12}  {verdict}")
    low = [j for j in done if j["accuracy"] < a.accuracy]
    if done:
        accs = [j["accuracy"] * 100 for j in done]
        print(f"accuracy of completed jobs: min {min(accs):.2f} %, last {accs[-1]:.2f} % "
              f"(target >= {a.accuracy * 100:.1f} %: {'met' if not low else 'NOT met by ' + str(len(low))})")
    print(f"hangs: {len(soak.hangs)}")
    for k, text in soak.hangs:
        print(f"  job {k}: {text}")
    print(f"orphans: {len(soak.orphans)}")
    for k, where, d in soak.orphans:
        print(f"  job {k}, {where}: {d}")
    longest = max((j["longest"] for j in soak.jobs if j["longest"]), key=lambda w: w.seconds, default=None)
    if longest:
        print(f"longest unexplained wait: {longest.seconds:.1f} s (bound {longest.bound:g} s): {longest.describe()}")
    if soak.late_joiners:
        print(f"late joiners stopped by the soak (joined a job that had finished): {soak.late_joiners}")
    print(f"seed: {a.seed} (replay: {replay_command(a)})")
    failed = []
    if soak.hangs:
        failed.append(f"{len(soak.hangs)} hang(s)")
    if soak.orphans:
        failed.append(f"{len(soak.orphans)} orphan(s)")
    if silent:
        failed.append(f"{len(silent)} job(s) ended without a named root cause")
    if low:
        failed.append(f"{len(low)} completed job(s) below {a.accuracy * 100:.1f} %")
    if not done:
        failed.append("no job completed")
    if total < a.min_faults:
        failed.append(f"{total} fault(s) injected, fewer than --min_faults {a.min_faults}")
    print(f"logs: {a.log_dir}{'' if failed or a.keep_logs else ' (removed: every check passed)'}")
    return failed


def main():
    ap = argparse.ArgumentParser(description="chaos soak: an elastic Fashion-MNIST job on 4 hosts through a daemon, "
                                             "with seeded random faults")
    ap.add_argument("--seed", type=int, default=None, help="the fault generator's seed (default: a random one, printed)")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    ap.add_argument("--min_gap", type=float, default=2.0, help="least seconds between two faults")
    ap.add_argument("--max_gap", type=float, default=6.0, help="most seconds between two faults")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds a new job runs before the first fault")
    ap.add_argument("--min_nodes", type=int, default=2, help="MIN of --nnodes MIN:4")
    ap.add_argument("--nproc_per_node", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--max_restarts", type=int, default=10000)
    ap.add_argument("--heartbeat_timeout", type=float, default=4.0, help="ddprun's and the daemon's")
    ap.add_argument("--stall_timeout", type=float, default=5.0, help="ddprun's (--stall_action report)")
    ap.add_argument("--grace_period", type=float, default=5.0)
    ap.add_argument("--join_timeout", type=float, default=60.0)
    ap.add_argument("--wait_bound", type=float, default=None,
                    help="longest wait after progress without a report (default: max(heartbeat, stall timeout) + 4 s)")
    ap.add_argument("--report_period", type=float, default=30.0,
                    help="a waiting phase says again what it waits for within this many seconds (+5 s slack)")
    ap.add_argument("--exit_barrier_slack", type=float, default=15.0,
                    help="seconds after the RESULT line before agents without workers count as late joiners")
    ap.add_argument("--orphan_settle", type=float, default=5.0,
                    help="seconds after a ddprun's SIGKILL within which its workers must be gone")
    ap.add_argument("--finish_timeout", type=float, default=300.0,
                    help="seconds the last job may take to end after the faults stop")
    ap.add_argument("--accuracy", type=float, default=0.885, help="the least final test accuracy of a completed job")
    ap.add_argument("--min_faults", type=int, default=1, help="fail when fewer faults were injected")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between two `ddprun status` readings")
    ap.add_argument("--log_dir", help="keep the logs here (default: a temporary folder, printed, removed when "
                                      "every check passed)")
    a = ap.parse_args()
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 1 << 31)
    if a.wait_bound is None:
        a.wait_bound = max(a.heartbeat_timeout, a.stall_timeout) + 4.0
    if not (1 <= a.min_nodes <= JOB_HOSTS) or a.min_gap <= 0 or a.max_gap < a.min_gap or a.duration <= 0:
        sys.exit("chaos: bad arguments (--min_nodes 1..4, 0 < --min_gap <= --max_gap, --duration > 0)")
    paths.require_root("chaos")
    paths.require("chaos", paths.DDPRUN, paths.DAEMON, paths.FASHION_MNIST)
    a.keep_logs = a.log_dir is not None
    a.log_dir = a.log_dir or tempfile.mkdtemp(prefix=f"ddprun-chaos-{a.seed}-")
    os.makedirs(a.log_dir, exist_ok=True)
    print(f"chaos soak: seed {a.seed}, logs in {a.log_dir}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("chaos: terminated"))
    hosts = Hosts(JOB_HOSTS + 1)
    try:
        soak = Soak(a, hosts)
        soak.run()
    finally:
        for h in range(hosts.count):
            for pid in hosts.pids(h):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            hosts.kill_all(h)
        hosts.close()
    failed = summary(a, soak)
    if failed:
        sys.exit("chaos: FAILED: " + "; ".join(failed) + f" (seed {a.seed})")
    if not a.keep_logs:
        shutil.rmtree(a.log_dir, ignore_errors=True)
    print("chaos: every check passed")


if __name__ == "__main__":
    main()
