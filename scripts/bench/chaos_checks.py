"""What scripts/bench/chaos checks once a job of the soak is over (see chaos_bench.py).

Terms:
  event      a timestamped line of an agent's output, or a reading of `ddprun status` that
             differs from the one before; each is progress or a report
  progress   a worker's line ("[rankN]:..." through its ddprun) or a status reading in which
             some rank's current call changed: the job moved
  report     a line ddprun printed itself (a warning, an error, a summary, "still waiting"):
             the job said what it waits for or what happened
  wait       the time between two consecutive events of a job (from its first agent's start
             to its last agent's exit): nothing moved and nothing was said
  bound      how long a wait may last: after progress, the stall/heartbeat bound (a stall
             report or a lost node is due by then); after a report, the period within which a
             waiting phase must say again what it waits for
  hang       a wait longer than its bound (unexplained), or a job that did not end in time
  orphan     a process left on a job's host after every agent of the job exited or was killed
"""
import os
import re
import signal
import threading
import time

from harness.hosts import processes_in as live_in
from harness.procs import children

RESULT = re.compile(r"RESULT world (\d+) test_acc ([0-9.]+)")
ROOT_CAUSE = re.compile(r"Root cause|ddprun: error:")
WORKER_LINE = re.compile(r"^\[rank\d+\]:")


class Timeline:
    """A job's events, appended from the agents' reader threads and the status poller."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = []  # (t, kind, source, text), kind "progress" or "report"

    def add(self, t, kind, source, text):
        with self.lock:
            self.events.append((t, kind, source, text))

    def line(self, t, source, text):
        self.add(t, "progress" if WORKER_LINE.match(text) else "report", source, text)

    def sorted(self):
        with self.lock:
            return sorted(self.events, key=lambda e: e[0])


class Wait:
    """One wait: from `start` (after the event `before`) to `end` (the next event)."""

    def __init__(self, start, end, before, after, bound):
        self.start, self.end, self.before, self.after, self.bound = start, end, before, after, bound

    @property
    def seconds(self):
        return self.end - self.start

    @property
    def hang(self):
        return self.seconds > self.bound

    def describe(self):
        def ev(e):
            return f"{e[1]} from {e[2]}: {e[3][:160]!r}" if e else "(none)"
        return (f"{self.seconds:.1f} s without progress or report (bound {self.bound:g} s), "
                f"t={self.start:.1f}..{self.end:.1f}; before: {ev(self.before)}; after: {ev(self.after)}")


def waits(timeline, begin, end, progress_bound, report_bound):
    """Every wait of a job that ran from `begin` to `end` (soak seconds)."""
    out, last_t = [], begin
    last = (begin, "progress", "soak", "job started")
    for e in timeline.sorted() + [(end, "progress", "soak", "job over")]:
        bound = report_bound if last[1] == "report" else progress_bound
        out.append(Wait(last_t, e[0], last, e, bound))
        last_t, last = max(last_t, e[0]), e
    return out


def longest_wait(ws):
    return max(ws, key=lambda w: w.seconds, default=None)


def status_signature(reading):
    """What changes in a `ddprun status --json` reading when the job moves: the attempt and
    each rank's current call (its number grows with every collective)."""
    ranks = tuple(sorted((r.get("rank"), r.get("call"), r.get("call_state"), r.get("state"))
                         for r in reading.get("ranks", [])))
    return (reading.get("attempt"), ranks)


def accuracy(text):
    """The job's final accuracy (a fraction) from rank 0's RESULT line, or None."""
    m = None
    for m in RESULT.finditer(text):
        pass
    return float(m[2]) if m else None


def named_root_cause(text, tail=40):
    """The line naming why an agent ended without finishing, in its last `tail` lines of
    output (an earlier summary is of an attempt the job re-formed after), or None."""
    lines = text.splitlines()[-tail:]
    for i, line in enumerate(lines):
        if ROOT_CAUSE.search(line):
            follow = lines[i + 1] if line.startswith("Root cause") and i + 1 < len(lines) else ""
            return (line + " " + follow.strip()).strip()
    return None


# ---------------------------------------------------------------------------
# Processes on the hosts
# ---------------------------------------------------------------------------

def netns_inode(name):
    return os.stat(f"/run/netns/{name}").st_ino


def _stat(pid):
    """(state, ppid, comm) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    rest = text.rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), comm


def workers_of(agent_pid, program="fashion_mnist"):
    """The agent's worker processes (its children running `program`; ddprun's other child,
    the orphan guard, is left out), live and not zombies."""
    out = []
    for pid in children(agent_pid):
        st = _stat(pid)
        if st and st[2] == program[:15] and st[0] not in ("Z", "X"):
            out.append(pid)
    return out


def process_state(pid):
    st = _stat(pid)
    return st[0] if st else None


def describe_process(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        st = _stat(pid)
        return f"pid {pid} ({st[0] if st else '?'}) {' '.join(a.decode(errors='replace') for a in argv[:3])}"
    except OSError:
        return f"pid {pid} (gone)"


def descendants(pid):
    """A process's children, their children, and so on."""
    out, todo = [], children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def reap(pids):
    """Those of `pids` still alive: described, SIGCONTed and SIGKILLed (so nothing of
    theirs lingers into the next job); returns their descriptions."""
    left = [p for p in pids if process_state(p) not in (None, "Z", "X")]
    found = [describe_process(p) for p in left]
    for _ in range(50):
        if not left:
            break
        for pid in left:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.05)
        left = [p for p in left if process_state(p) not in (None, "Z", "X")]
    return found


def reap_orphans(inode, settle=5.0):
    """Processes still in the namespace after `settle` seconds, reaped (see reap)."""
    deadline = time.monotonic() + settle
    while live_in(inode) and time.monotonic() < deadline:
        time.sleep(0.1)
    return reap(live_in(inode))
