"""The benchmark behind scripts/bench/hostfile (see there for usage)."""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from harness import paths
from harness.runs import interleaved, median
from harness.ssh_hosts import SshHosts

HOSTS, PER_HOST = 3, 2
WORKERS = HOSTS * PER_HOST

# The one worker both launchers run: a stamp of the wall clock (one machine, one clock)
# in a file of its own in DIR, then it exits, or with "stay" sleeps until stopped.
WORKER = 'date +%s.%N > "$0/stamp.$$.tmp" && mv "$0/stamp.$$.tmp" "$0/stamp.$$"; [ "$1" = stay ] && exec sleep 600; :'


def launcher_argv(name, hosts, hostfile, stamps, stay, opts):
    worker = ["sh", "-c", WORKER, stamps, "stay" if stay else "exit"]
    if name == "ssh":
        # The floor: plain parallel ssh starting the same workers (what pdsh does), with
        # no launcher, rendezvous or supervision at all.
        one = "sh -c " + shlex.quote(WORKER) + " " + shlex.quote(stamps) + (" stay" if stay else " exit")
        remote = " & ".join([one] * PER_HOST) + "; wait"
        script = " & ".join(f"{hosts.ssh_command()} {hosts.address(i)} {shlex.quote(remote)}"
                            for i in range(HOSTS)) + "; wait"
        return ["sh", "-c", script]
    if name == "ddprun":
        return [paths.DDPRUN, "--hostfile", hostfile, f"--grace_period={opts.grace_period:g}",
                f"--heartbeat_timeout={opts.heartbeat_timeout:g}", *worker]
    # OpenMPI's own launch settings otherwise (its tree spawn on or off measured the same
    # here, 1.39 vs 1.42 s); the same ssh command as ddprun's DDPRUN_SSH.
    return ["mpirun", "--allow-run-as-root", "--hostfile", hostfile, "-np", str(WORKERS),
            "--mca", "plm_rsh_agent", hosts.ssh_command(), "--mca", "btl", "self,tcp", *worker]


def start(name, hosts, hostfile, stamps, stay, opts):
    env = dict(os.environ, DDPRUN_SSH=hosts.ssh_command())
    argv = hosts.on(hosts.login, launcher_argv(name, hosts, hostfile, stamps, stay, opts))
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stamps_in(folder):
    out = []
    for f in os.listdir(folder):
        if f.startswith("stamp.") and not f.endswith(".tmp"):
            with open(os.path.join(folder, f)) as s:
                out.append(float(s.read()))
    return out


def wait_stamps(proc, folder, limit=60):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = stamps_in(folder)
        if len(got) == WORKERS:
            return got
        if proc.poll() is not None and proc.returncode != 0:
            break
        time.sleep(0.002)
    proc.kill()
    _, err = proc.communicate()
    sys.exit(f"hostfile bench: {len(stamps_in(folder))} of {WORKERS} workers started; launcher said:\n{err}")


def start_latency_once(name, hosts, hostfile, opts):
    """Seconds from the launcher's start to the last of the 6 workers' stamps; the launcher
    must then finish with status 0."""
    with tempfile.TemporaryDirectory(prefix="ddprun-bench-stamps-") as stamps:
        t0 = time.time()
        proc = start(name, hosts, hostfile, stamps, False, opts)
        latest = max(wait_stamps(proc, stamps))
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            sys.exit(f"hostfile bench: {name} did not finish after its workers did")
        if proc.returncode != 0:
            sys.exit(f"hostfile bench: {name} failed with {proc.returncode}:\n{err}")
        return latest - t0


def cleanup_once(name, hosts, hostfile, sig, opts, limit):
    """Starts workers that stay, sends `sig` to the launcher once all 6 run, and returns
    (seconds until no process of the job is left on any host or the login node, seconds
    until no worker is left); None where some outlive `limit` (they are killed then)."""
    with tempfile.TemporaryDirectory(prefix="ddprun-bench-stamps-") as stamps:
        proc = start(name, hosts, hostfile, stamps, True, opts)
        wait_stamps(proc, stamps)
        # The count below must see the job: all 6 workers (a stamp comes just before the exec).
        deadline = time.monotonic() + 10
        while sum(1 for p in hosts.job_processes() if is_worker(p)) != WORKERS and time.monotonic() < deadline:
            time.sleep(0.002)
        if sum(1 for p in hosts.job_processes() if is_worker(p)) != WORKERS:
            proc.kill()
            sys.exit(f"hostfile bench: {name}'s {WORKERS} workers not found among the hosts' processes")
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)  # the launcher itself (reaped, so it is not counted as left)
        gone = workers_gone = None
        while time.monotonic() - t0 < limit:
            left = hosts.job_processes()
            if workers_gone is None and not any(is_worker(p) for p in left):
                workers_gone = time.monotonic() - t0
            if not left:
                gone = time.monotonic() - t0
                break
            time.sleep(0.002)
        hosts.kill_job_processes()
        return gone, workers_gone


def is_worker(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read() == b"sleep\x00600\x00"  # what the worker became (exec sleep 600)
    except OSError:
        return False


def median_or_none(values):
    done = [v for v in values if v is not None]
    return median(done) if len(done) == len(values) and done else None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--grace_period", type=float, default=5.0)
    parser.add_argument("--heartbeat_timeout", type=float, default=5.0)
    parser.add_argument("--launchers", default="ddprun,mpirun,ssh",
                        help="comma-separated: ddprun, mpirun, ssh (plain parallel ssh: the floor; start time only)")
    parser.add_argument("--json", help="also write the figures to this file")
    opts = parser.parse_args()
    paths.require_root("hostfile bench", "network namespaces, sshd")
    names = opts.launchers.split(",")
    if "ddprun" in names:
        paths.require("hostfile bench", paths.DDPRUN)

    hosts = SshHosts(HOSTS)
    try:
        hostfile = os.path.join(hosts.dir, "hostfile")
        with open(hostfile, "w") as f:
            f.writelines(f"{hosts.address(i)} slots={PER_HOST}\n" for i in range(HOSTS))
        for name in names:  # one warm-up each (page cache, sshd's first sessions)
            start_latency_once(name, hosts, hostfile, opts)
        starts = {n: [] for n in names}
        for _, order in interleaved(opts.runs, names):  # so drifts in machine load hit all alike
            for name in order:
                starts[name].append(start_latency_once(name, hosts, hostfile, opts))
        limits = {signal.SIGINT: opts.grace_period + 10, signal.SIGKILL: opts.heartbeat_timeout + 10}
        supervised = [n for n in names if n != "ssh"]
        cleanup = {n: {s.name: [] for s in limits} for n in supervised}
        workers_gone = {n: {s.name: [] for s in limits} for n in supervised}
        for _ in range(opts.runs):
            for name in supervised:
                for sig, limit in limits.items():
                    gone, workers = cleanup_once(name, hosts, hostfile, sig, opts, limit)
                    cleanup[name][sig.name].append(gone)
                    workers_gone[name][sig.name].append(workers)
    finally:
        hosts.close()

    result = {
        "hosts": HOSTS, "workers_per_host": PER_HOST, "runs": opts.runs,
        "grace_period_s": opts.grace_period, "heartbeat_timeout_s": opts.heartbeat_timeout,
        "start_to_all_running_s": {n: {"median": median(v), "min": min(v), "max": max(v), "all": v}
                                   for n, v in starts.items()},
        "cleanup_s": {n: {s: {"median": median_or_none(v), "all": v} for s, v in c.items()}
                      for n, c in cleanup.items()},
        "workers_gone_s": {n: {s: {"median": median_or_none(v), "all": v} for s, v in c.items()}
                           for n, c in workers_gone.items()},
    }
    print(f"{HOSTS} sshd hosts x {PER_HOST} workers, launcher on a 4th namespace, "
          f"median of {opts.runs} alternating runs")
    print(f"{'launcher':<8} {'start->all 6 running ms':>24} {'min':>8} {'max':>8} "
          f"{'SIGINT->none left ms':>21} {'SIGKILL->none left ms':>22}")

    def ms(v):
        return f"{v * 1e3:.0f}" if v is not None else "left"
    for n in names:
        s, c = result["start_to_all_running_s"][n], result["cleanup_s"].get(n)
        print(f"{n:<8} {s['median'] * 1e3:>24.0f} {s['min'] * 1e3:>8.0f} {s['max'] * 1e3:>8.0f} "
              f"{ms(c['SIGINT']['median']) if c else '-':>21} {ms(c['SIGKILL']['median']) if c else '-':>22}")
    for n in supervised:
        w = result["workers_gone_s"][n]
        print(f"{n:<8} workers alone gone after SIGINT {ms(w['SIGINT']['median'])} ms, "
              f"after SIGKILL {ms(w['SIGKILL']['median'])} ms")
    if "ddprun" in names and "mpirun" in names:
        ratio = median(starts["ddprun"]) / median(starts["mpirun"])
        result["start_ratio_ddprun_over_mpirun"] = ratio
        print(f"ddprun/mpirun start time: {ratio:.2f} (target <= 0.5)")
    if "ssh" in names and "mpirun" in names:
        floor = median(starts["ssh"]) / median(starts["mpirun"])
        result["start_ratio_ssh_over_mpirun"] = floor
        print(f"plain parallel ssh/mpirun start time: {floor:.2f} (no launcher can go below this ratio "
              f"without reusing ssh connections)")
    if "ddprun" in names:
        c = result["cleanup_s"]["ddprun"]
        print(f"ddprun SIGINT: none left after {ms(c['SIGINT']['median'])} ms "
              f"(target <= grace period, {opts.grace_period * 1e3:.0f} ms); "
              f"SIGKILL: none left after {ms(c['SIGKILL']['median'])} ms "
              f"(target <= heartbeat timeout + 1 s, {(opts.heartbeat_timeout + 1) * 1e3:.0f} ms)")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"figures written to {opts.json}")


if __name__ == "__main__":
    main()
