"""The benchmark behind scripts/bench/train (see there)."""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
DDPRUN = os.path.join(BUILD, "launcher", "ddprun")
EXAMPLE = os.path.join(BUILD, "examples", "fashion_mnist", "fashion_mnist")
PEERS = os.environ.get("DDPRUN_PEERS_DIR", os.path.join(ROOT, "..", "shared", "peers"))
PY = "/usr/bin/python3"
RESULT = re.compile(r"RESULT world (\d+) test_acc ([\d.]+) samples_per_s (\d+)(?: step_ms_median ([\d.]+))?")


def run(argv, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    m = RESULT.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return {"acc": float(m[2]), "sps": float(m[3]), "step_ms": float(m[4]) if m[4] else None}


def ours(world, epochs, *extra):
    return run([DDPRUN, f"--nproc_per_node={world}", EXAMPLE, "--epochs", str(epochs), *extra])


def torch_ddp(world, epochs, env_extra=None):
    return run([PY, os.path.join(PEERS, "torchrun.py"), f"--nproc_per_node={world}", "--monitor_interval", "0.1",
                os.path.join(PEERS, "torch_fashion_mnist.py"), "--epochs", str(epochs)], env_extra)


def med(xs):
    return statistics.median(xs)


def has_avx512():
    # OPENBLAS_CORETYPE=SkylakeX on a CPU without AVX-512 kills torch with SIGILL.
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " avx512f" in line for line in f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per throughput run")
    ap.add_argument("--accuracy", action="store_true",
                    help="also 10-epoch accuracy for 1, 2 and 4 workers, and 2 workers with bf16 gradients")
    a = ap.parse_args()
    if not os.path.exists(EXAMPLE):
        sys.exit(f"{EXAMPLE} is missing: build first (scripts/setup)")
    worlds = (1, 2, 4)
    tuned = has_avx512()
    s = {k: [] for k in ["d1", "d2", "d4", "t1", "t2", "t4", "t2tuned", "on", "off"]}
    for i in range(a.runs):  # interleaved: outside load hits every configuration alike
        for w in worlds:
            s[f"d{w}"].append(ours(w, a.epochs, "--no-eval")["sps"])
            s[f"t{w}"].append(torch_ddp(w, a.epochs)["sps"])
        # Debian's OpenBLAS misdetects some AVX-512 CPUs; there the peer runs with the
        # core type forced too.
        if tuned:
            s["t2tuned"].append(torch_ddp(2, a.epochs, {"OPENBLAS_CORETYPE": "SkylakeX"})["sps"])
        s["on"].append(ours(2, a.epochs, "--no-eval")["step_ms"])
        s["off"].append(ours(2, a.epochs, "--no-eval", "--no-allreduce")["step_ms"])
        print(f"run {i + 1}/{a.runs} done", file=sys.stderr, flush=True)

    print(f"Fashion-MNIST MLP 784-256-128-10, batch 64 per worker, AdamW, {a.epochs} epochs; "
          f"training samples/s, medians of {a.runs} interleaved runs")
    print(f"{'workers':>7} {'ddprun':>9} {'torch DDP':>10} {'ratio':>7} {'vs our 1 worker':>16}")
    for w in worlds:
        d, t = med(s[f"d{w}"]), med(s[f"t{w}"])
        print(f"{w:>7} {d:9.0f} {t:10.0f} {d / t:7.2f} {d / med(s['d1']):16.2f}")
    d2, t2 = med(s["d2"]), med(s["t2"])
    if tuned:
        tt = med(s["t2tuned"])
        print(f"torch DDP 2 workers with OPENBLAS_CORETYPE=SkylakeX: {tt:.0f} samples/s (ddprun {d2 / tt:.2f}x)")
    on, off = med(s["on"]), med(s["off"])
    print(f"2 workers, median step: {on:.3f} ms with all-reduce, {off:.3f} ms without: {on / off:.2f}x")
    print(f"targets: 2 workers >= 2x torch DDP: {'met' if d2 >= 2 * t2 else 'NOT met'} ({d2 / t2:.2f}x); "
          f">= 1.7x our 1 worker: {'met' if d2 >= 1.7 * med(s['d1']) else 'NOT met'} ({d2 / med(s['d1']):.2f}x); "
          f"step <= 1.15x without all-reduce: {'met' if on <= 1.15 * off else 'NOT met'} ({on / off:.2f}x)")
    if a.accuracy:
        accs = {w: ours(w, 10)["acc"] for w in worlds}
        spread = (max(accs.values()) - min(accs.values())) * 100
        print("10 epochs, test accuracy: " + ", ".join(f"{w} worker(s) {accs[w] * 100:.2f}%" for w in worlds))
        print(f"targets: >= 88.5%: {'met' if min(accs.values()) >= 0.885 else 'NOT met'}; "
              f"within 0.5 points: {'met' if spread <= 0.5 else 'NOT met'} (spread {spread:.2f})")
        # bf16 gradient communication (issue 16): rounded once to bf16, reduced in f32.
        bf16 = ours(2, 10, "--grad_dtype", "bf16")["acc"]
        print(f"10 epochs, 2 workers, --grad_dtype bf16: test accuracy {bf16 * 100:.2f}% "
              f"(f32 {accs[2] * 100:.2f}%); target >= 88.5%: {'met' if bf16 >= 0.885 else 'NOT met'}")


if __name__ == "__main__":
    main()
