"""The benchmark behind scripts/bench/flight_recorder (see there)."""
import argparse
import os
import re
import sys

from harness import paths
from harness.procs import result_line
from harness.runs import Samples, interleaved

LATENCY = re.compile(r"all_reduce\s+4096\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+(\d+)")
STEP = re.compile(r"RESULT world \d+ test_acc [\d.]+ samples_per_s \d+ step_ms_median ([\d.]+)")
SETTINGS = {"default": {}, "off": {"DDP_FLIGHT_RECORDER": "0"}}


def run(argv, pattern, env_extra):
    env = {k: v for k, v in os.environ.items() if k != "DDP_FLIGHT_RECORDER"}
    env.update(OMP_NUM_THREADS="1", **env_extra)
    return result_line(argv, pattern, env)


def latency_us(env_extra):
    m = run([paths.DDPRUN, "--nproc_per_node=2", paths.DDP_BENCH, "-b", "4K", "-e", "4K", "-o", "all_reduce",
             "-w", "200", "--target_ms", "500", "-n", "1000000"], LATENCY, env_extra)
    if m[2] != "0":
        sys.exit("ddp-bench reported wrong results")
    return float(m[1])


def step_ms(env_extra, epochs):
    return float(run([paths.DDPRUN, "--nproc_per_node=2", paths.FASHION_MNIST, "--epochs", str(epochs), "--no-eval"],
                     STEP, env_extra)[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1, help="epochs per training run")
    a = ap.parse_args()
    paths.require("flight_recorder bench", paths.DDPRUN, paths.DDP_BENCH, paths.FASHION_MNIST)
    lat, step = Samples(), Samples()
    for i, order in interleaved(a.runs, SETTINGS, alternate=True):  # load and warm-up hit both alike
        for k in order:
            lat[k].append(latency_us(SETTINGS[k]))
        for k in order:
            step[k].append(step_ms(SETTINGS[k], a.epochs))
        print(f"run {i + 1}/{a.runs}: 4 KiB all-reduce {lat['default'][-1]:.2f} / {lat['off'][-1]:.2f} us, "
              f"step {step['default'][-1]:.3f} / {step['off'][-1]:.3f} ms (recorder default / off)",
              file=sys.stderr, flush=True)

    print(f"flight recorder cost, 2 ranks, medians of {a.runs} interleaved runs "
          f"(default: {2000} entries; off: DDP_FLIGHT_RECORDER=0)")
    print(f"{'measure':<34} {'default':>10} {'off':>10} {'ratio':>7}   best of runs (a loaded 2-core machine's floor)")
    rows = [("4 KiB all-reduce latency (us)", lat), (f"Fashion-MNIST DDP step ({a.epochs} epoch) (ms)", step)]
    verdicts = []
    for name, xs in rows:
        (d, bd, _, _), (o, bo, _, _) = xs.figures("default"), xs.figures("off")
        print(f"{name:<34} {d:10.3f} {o:10.3f} {d / o:7.3f}   {bd:.3f} / {bo:.3f} = {bd / bo:.3f}")
        verdicts.append(f"{name.split(' (')[0]}: {'met' if d <= 1.03 * o else 'NOT met'} ({d / o:.3f})")
    print("target <= 1.03x the recorder off: " + "; ".join(verdicts))


if __name__ == "__main__":
    main()
