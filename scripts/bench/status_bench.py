"""The `ddprun status` benchmark behind scripts/bench/status (see there for usage)."""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from harness import paths
from harness.runs import figures, median


def status_latency(ranks, runs, env):
    """Median and max seconds of `ddprun status` (table and --json) against a running job."""
    job = subprocess.Popen([paths.DDPRUN, f"--nproc_per_node={ranks}", "--standalone", paths.TEST_WORKER,
                            "progress", "steady"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:  # until every rank's record is in
            r = subprocess.run([paths.DDPRUN, "status", "--json"], env=env, capture_output=True, text=True)
            if r.returncode == 0 and sum(1 for x in json.loads(r.stdout)["ranks"] if x["call"]) == ranks:
                break
            if time.monotonic() > deadline:
                sys.exit(f"status bench: the {ranks}-rank job did not publish its records in 120 s: {r.stderr}")
            time.sleep(0.2)
        out = {}
        for name, extra in (("table", []), ("json", ["--json"])):
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                r = subprocess.run([paths.DDPRUN, "status"] + extra, env=env, capture_output=True, text=True)
                times.append(time.perf_counter() - start)
                if r.returncode != 0:
                    sys.exit(f"status bench: ddprun status failed: {r.stderr}")
            out[name] = times
        return out
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(60)


def stall_report_delay(timeout_s, env):
    """Seconds from the stall's onset (every rank printed its last completed call) to the report."""
    job = subprocess.Popen([paths.DDPRUN, "--nproc_per_node=4", "--standalone", f"--stall_timeout={timeout_s}",
                            "--grace_period=2", paths.TEST_WORKER, "progress", "stall", "1", "5"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marks = {}

    def watch(stream, needle, key, count):
        seen = 0
        for line in stream:
            if needle in line:
                seen += 1
                if seen == count and key not in marks:
                    marks[key] = time.perf_counter()
                    # "...: no rank completed a call for 2.2 s (--stall_timeout 2)": when ddprun decided
                    if "completed a call for " in line:
                        marks["detected"] = float(line.split("completed a call for ")[1].split(" s")[0])

    threads = [threading.Thread(target=watch, args=(job.stdout, "progress: completed", "onset", 4), daemon=True),
               threading.Thread(target=watch, args=(job.stderr, "stall report for job", "report", 1), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s + 60
    while "report" not in marks and time.monotonic() < deadline:
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    job.wait(60)
    if "report" not in marks or "onset" not in marks:
        sys.exit("status bench: no stall report came")
    return marks["report"] - marks["onset"], marks.get("detected", float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--stalls", type=int, default=5)
    ap.add_argument("--stall-timeout", type=float, default=2.0)
    a = ap.parse_args()
    paths.require("status bench", paths.DDPRUN, paths.TEST_WORKER)
    with tempfile.TemporaryDirectory() as runtime:
        env = dict(os.environ, XDG_RUNTIME_DIR=runtime)
        lat = status_latency(a.ranks, a.runs, env)
        for name, times in lat.items():
            f = figures(times)
            print(f"ddprun status ({name}), {a.ranks} ranks, {a.runs} runs: median {f.median * 1000:.1f} ms,"
                  f" max {f.max * 1000:.1f} ms (target < 200 ms)")
        runs = [stall_report_delay(a.stall_timeout, env) for _ in range(a.stalls)]
        delays = figures(r[0] for r in runs)
        detected = median([r[1] for r in runs])
        print(f"stall onset to report, --stall_timeout={a.stall_timeout:g}, 4 ranks, {a.stalls} runs: median "
              f"{delays.median:.2f} s, max {delays.max:.2f} s (target < {a.stall_timeout + 2:g} s); "
              f"detected after a median {detected:.1f} s, the rest is gdb on 4 workers "
              f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
