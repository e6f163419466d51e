"""The benchmark behind scripts/bench/flight_recorder (see there)."""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
DDPRUN = os.path.join(BUILD, "launcher", "ddprun")
BENCH = os.path.join(BUILD, "worker_runtime", "ddp-bench")
EXAMPLE = os.path.join(BUILD, "examples", "fashion_mnist", "fashion_mnist")
LATENCY = re.compile(r"all_reduce\s+4096\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+(\d+)")
STEP = re.compile(r"RESULT world \d+ test_acc [\d.]+ samples_per_s \d+ step_ms_median ([\d.]+)")
SETTINGS = {"default": {}, "off": {"DDP_FLIGHT_RECORDER": "0"}}


def run(argv, pattern, env_extra):
    env = {k: v for k, v in os.environ.items() if k != "DDP_FLIGHT_RECORDER"}
    env.update(OMP_NUM_THREADS="1", **env_extra)
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    m = pattern.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return m


def latency_us(env_extra):
    m = run([DDPRUN, "--nproc_per_node=2", BENCH, "-b", "4K", "-e", "4K", "-o", "all_reduce", "-w", "200",
             "--target_ms", "500", "-n", "1000000"], LATENCY, env_extra)
    if m[2] != "0":
        sys.exit("ddp-bench reported wrong results")
    return float(m[1])


def step_ms(env_extra, epochs):
    return float(run([DDPRUN, "--nproc_per_node=2", EXAMPLE, "--epochs", str(epochs), "--no-eval"], STEP,
                     env_extra)[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1, help="epochs per training run")
    a = ap.parse_args()
    for path in (DDPRUN, BENCH, EXAMPLE):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: build first (scripts/setup)")
    lat = {k: [] for k in SETTINGS}
    step = {k: [] for k in SETTINGS}
    for i in range(a.runs):  # interleaved, the order alternating: load and warm-up hit both alike
        order = list(SETTINGS) if i % 2 == 0 else list(reversed(SETTINGS))
        for k in order:
            lat[k].append(latency_us(SETTINGS[k]))
        for k in order:
            step[k].append(step_ms(SETTINGS[k], a.epochs))
        print(f"run {i + 1}/{a.runs}: 4 KiB all-reduce {lat['default'][-1]:.2f} / {lat['off'][-1]:.2f} us, "
              f"step {step['default'][-1]:.3f} / {step['off'][-1]:.3f} ms (recorder default / off)",
              file=sys.stderr, flush=True)

    med = statistics.median
    print(f"flight recorder cost, 2 ranks, medians of {a.runs} interleaved runs "
          f"(default: {2000} entries; off: DDP_FLIGHT_RECORDER=0)")
    print(f"{'measure':<34} {'default':>10} {'off':>10} {'ratio':>7}   best of runs (a loaded 2-core machine's floor)")
    rows = [("4 KiB all-reduce latency (us)", lat), (f"Fashion-MNIST DDP step ({a.epochs} epoch) (ms)", step)]
    verdicts = []
    for name, xs in rows:
        d, o = med(xs["default"]), med(xs["off"])
        bd, bo = min(xs["default"]), min(xs["off"])
        print(f"{name:<34} {d:10.3f} {o:10.3f} {d / o:7.3f}   {bd:.3f} / {bo:.3f} = {bd / bo:.3f}")
        verdicts.append(f"{name.split(' (')[0]}: {'met' if d <= 1.03 * o else 'NOT met'} ({d / o:.3f})")
    print("target <= 1.03x the recorder off: " + "; ".join(verdicts))


if __name__ == "__main__":
    main()
