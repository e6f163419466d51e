"""The launch benchmark behind scripts/bench/launch (see there for usage)."""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
PEERS = os.environ.get("DDPRUN_PEERS_DIR", os.path.join(ROOT, "..", "shared", "peers"))
DDPRUN = os.path.join(BUILD, "launcher", "ddprun")


def commands():
    mpi_env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {
        "ddprun": ([DDPRUN, "--nproc_per_node=4", "--standalone", "/bin/true"], {}),
        "torchrun": (["/usr/bin/python3", os.path.join(PEERS, "torchrun.py"), "--nproc_per_node=4",
                      "--monitor_interval", "0.1", "--no_python", "/bin/true"], {}),
        "mpirun": (["mpirun", "--oversubscribe", "-np", "4", "/bin/true"], mpi_env),
    }


def spawn_and_wait(argv, env):
    pid = os.posix_spawnp(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)])
    _, status, _ = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"launch bench: {' '.join(argv)} failed with status {status}")


def wall_once(argv, extra_env):
    """Seconds from spawn to exit."""
    env = dict(os.environ, **extra_env)
    start = time.perf_counter()
    spawn_and_wait(argv, env)
    return time.perf_counter() - start


def peak_rss_once(argv, extra_env):
    """Peak RSS in MiB of the largest process of the launch (GNU time's %M: the launcher
    or any descendant it waited for). Measured through /usr/bin/time, a small C program,
    because a child forked from this Python process would report Python's own RSS."""
    env = dict(os.environ, **extra_env)
    with tempfile.NamedTemporaryFile("r") as out:
        spawn_and_wait(["/usr/bin/time", "-f", "%M", "-o", out.name] + argv, env)
        return int(out.read().split()[-1]) / 1024.0


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def kill_cleanup_once():
    """SIGKILL ddprun with 4 workers (each with a grandchild); seconds until none is alive."""
    worker = "sleep 300 & exec sleep 300"
    proc = subprocess.Popen([DDPRUN, "--nproc_per_node=4", "--standalone", "sh", "-c", worker],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    tree = []
    while time.monotonic() < deadline:
        workers = [p for p in children(proc.pid) if p != proc.pid]
        grand = [g for w in workers for g in children(w)]
        # 4 workers + the guard; each worker (sh -> exec sleep) has one sleep child
        if len(grand) >= 4:
            tree = [p for p in workers + grand]
            break
        time.sleep(0.005)
    if not tree:
        proc.kill()
        sys.exit("launch bench: the workers did not start")
    os.kill(proc.pid, signal.SIGKILL)
    start = time.perf_counter()
    proc.wait()
    while any(alive(p) for p in tree):
        if time.perf_counter() - start > 10:
            sys.exit("launch bench: workers still alive 10 s after SIGKILL of ddprun")
        time.sleep(0.0005)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    if not os.path.exists(DDPRUN):
        sys.exit(f"launch bench: {DDPRUN} not built (run scripts/setup)")

    cmds = commands()
    walls = {name: [] for name in cmds}
    rss = {name: [] for name in cmds}
    for name, (argv, env) in cmds.items():  # one warm-up each (page cache, pyc files)
        wall_once(argv, env)
    for _ in range(args.runs):  # interleaved, so drifts in machine load hit all alike
        for name, (argv, env) in cmds.items():
            walls[name].append(wall_once(argv, env))
            rss[name].append(peak_rss_once(argv, env))

    med_w = {n: statistics.median(v) for n, v in walls.items()}
    med_r = {n: statistics.median(v) for n, v in rss.items()}
    print(f"launch of 4 no-op workers, median of {args.runs} interleaved runs")
    print(f"{'launcher':<10} {'wall ms':>9} {'min ms':>8} {'peak RSS MiB':>13}")
    for n in cmds:
        print(f"{n:<10} {med_w[n] * 1e3:>9.2f} {min(walls[n]) * 1e3:>8.2f} {med_r[n]:>13.1f}")
    print(f"speed-up vs torchrun: {med_w['torchrun'] / med_w['ddprun']:.0f}x (target >= 100x)")
    print(f"speed-up vs mpirun:   {med_w['mpirun'] / med_w['ddprun']:.1f}x (target >= 3x)")
    print(f"peak RSS ddprun/torchrun: 1/{med_r['torchrun'] / med_r['ddprun']:.0f} (target <= 1/20)")

    kills = [kill_cleanup_once() for _ in range(max(5, args.runs // 2))]
    print(f"SIGKILL of ddprun -> last worker/grandchild gone: median {statistics.median(kills) * 1e3:.2f} ms, "
          f"max {max(kills) * 1e3:.2f} ms over {len(kills)} runs (target <= 1000 ms)")


if __name__ == "__main__":
    main()
