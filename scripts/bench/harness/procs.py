"""Running the programs a benchmark measures: its environment, a program's result line,
peak RSS, and the ddp-rendezvous daemon."""
import os
import re
import subprocess
import sys
import tempfile
import time

from . import paths


def bench_env(**extra):
    """This process's environment with OMP_NUM_THREADS=1 (2 cores: ranks must not
    oversubscribe them) and `extra`."""
    return dict(os.environ, OMP_NUM_THREADS="1", **extra)


def output(argv, env=None, **kw):
    """The program's stdout; raises CalledProcessError when it fails."""
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=True, **kw).stdout


def result_line(argv, pattern, env):
    """Runs `argv` to its end and returns the match of `pattern` in its stdout; exits with
    the ends of its output when it fails or prints no such line."""
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    m = pattern.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return m


def spawn_and_wait(who, argv, env):
    """Runs `argv` with stdout and stderr on /dev/null, from posix_spawn (no fork of this
    Python process); exits when it fails."""
    pid = os.posix_spawnp(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)])
    _, status, _ = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{who}: {' '.join(argv)} failed with status {status}")


def peak_rss_mib(who, argv, env):
    """Peak RSS in MiB of the largest process of a run of `argv` (GNU time's %M: the
    program or any descendant it waited for). Measured through /usr/bin/time, a small C
    program, because a child forked from this Python process would report Python's own RSS."""
    with tempfile.NamedTemporaryFile("r") as out:
        spawn_and_wait(who, ["/usr/bin/time", "-f", "%M", "-o", out.name] + argv, env)
        return int(out.read().split()[-1]) / 1024.0


def children(pid):
    """The pids of a process's children (none when it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def status_kib(pid, field="VmRSS"):
    """A /proc/PID/status figure in KiB: VmRSS (resident now) or VmHWM (peak resident)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/{pid}/status")


class Daemon:
    """ddp-rendezvous run with `args` (behind `on`, e.g. `ip netns exec NS`), its stdout and
    stderr in `log` (a temporary file when None), ready once it printed the line
    "ddp-rendezvous listening on HOST:PORT"; `port` is that port. A context manager that
    stops it (SIGTERM, SIGKILL after 10 s)."""

    LISTENING = re.compile(r"ddp-rendezvous listening on \S*:(\d+) ")

    def __init__(self, args, env=None, on=(), log=None, timeout=10.0):
        self.own_log = log is None
        if self.own_log:
            fd, log = tempfile.mkstemp(prefix="ddp-rendezvous-", suffix=".log")
            os.close(fd)
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([*on, paths.DAEMON, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        self.port = self._wait_listening(timeout)

    @property
    def pid(self):
        return self.proc.pid

    def _wait_listening(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log, errors="replace") as f:
                text = f.read()
            m = self.LISTENING.search(text)
            if m:
                return int(m[1])
            if self.proc.poll() is not None or time.monotonic() > deadline:
                where = "" if self.own_log else f" (its log: {self.log})"
                self.stop()
                sys.exit(f"{paths.DAEMON} did not start{where}:\n{text[-2000:]}")
            time.sleep(0.01)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.own_log and os.path.exists(self.log):
            os.unlink(self.log)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
