"""The launch benchmark behind scripts/bench/launch (see there for usage)."""
import argparse
import os
import signal
import subprocess
import sys
import time

from harness import paths
from harness.procs import children, peak_rss_mib, spawn_and_wait
from harness.runs import Samples, figures, interleaved

WHO = "launch bench"


def commands():
    mpi_env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {
        "ddprun": ([paths.DDPRUN, "--nproc_per_node=4", "--standalone", "/bin/true"], {}),
        "torchrun": ([paths.PY, paths.TORCHRUN_PY, "--nproc_per_node=4",
                      "--monitor_interval", "0.1", "--no_python", "/bin/true"], {}),
        "mpirun": (["mpirun", "--oversubscribe", "-np", "4", "/bin/true"], mpi_env),
    }


def wall_once(argv, extra_env):
    """Seconds from spawn to exit."""
    env = dict(os.environ, **extra_env)
    start = time.perf_counter()
    spawn_and_wait(WHO, argv, env)
    return time.perf_counter() - start


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def kill_cleanup_once():
    """SIGKILL ddprun with 4 workers (each with a grandchild); seconds until none is alive."""
    worker = "sleep 300 & exec sleep 300"
    proc = subprocess.Popen([paths.DDPRUN, "--nproc_per_node=4", "--standalone", "sh", "-c", worker],
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
    paths.require(WHO, paths.DDPRUN)
    paths.require_peers(WHO, paths.TORCHRUN_PY)

    cmds = commands()
    walls, rss = Samples(), Samples()
    for name, (argv, env) in cmds.items():  # one warm-up each (page cache, pyc files)
        wall_once(argv, env)
    for _, order in interleaved(args.runs, cmds):  # so drifts in machine load hit all alike
        for name in order:
            argv, env = cmds[name]
            walls[name].append(wall_once(argv, env))
            rss[name].append(peak_rss_mib(WHO, argv, dict(os.environ, **env)))

    med_w = {n: walls.median(n) for n in cmds}
    med_r = {n: rss.median(n) for n in cmds}
    print(f"launch of 4 no-op workers, median of {args.runs} interleaved runs")
    print(f"{'launcher':<10} {'wall ms':>9} {'min ms':>8} {'peak RSS MiB':>13}")
    for n in cmds:
        print(f"{n:<10} {med_w[n] * 1e3:>9.2f} {min(walls[n]) * 1e3:>8.2f} {med_r[n]:>13.1f}")
    print(f"speed-up vs torchrun: {med_w['torchrun'] / med_w['ddprun']:.0f}x (target >= 100x)")
    print(f"speed-up vs mpirun:   {med_w['mpirun'] / med_w['ddprun']:.1f}x (target >= 3x)")
    print(f"peak RSS ddprun/torchrun: 1/{med_r['torchrun'] / med_r['ddprun']:.0f} (target <= 1/20)")

    kills = figures(kill_cleanup_once() for _ in range(max(5, args.runs // 2)))
    print(f"SIGKILL of ddprun -> last worker/grandchild gone: median {kills.median * 1e3:.2f} ms, "
          f"max {kills.max * 1e3:.2f} ms over {kills.runs} runs (target <= 1000 ms)")


if __name__ == "__main__":
    main()
