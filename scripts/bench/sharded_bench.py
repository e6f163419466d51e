"""The benchmark behind scripts/bench/sharded (see there)."""
import argparse
import os
import re
import sys

from harness import paths
from harness.procs import bench_env, result_line
from harness.runs import Samples, interleaved, median

FSDP2 = os.path.join(paths.BENCH_DIR, "peers", "torch_fsdp2_mlp.py")
BASE = ["--wide", "--epochs", "1", "--limit-train", "12800", "--no-eval", "--batch", "64"]
# The example's RESULT line: the training figures, then the sharding ones.
OURS = re.compile(r"RESULT world \d+ test_acc [\d.]+ samples_per_s (\d+) step_ms_median ([\d.]+) comm_hidden ([\d.]+) "
                  r"rss_peak_mib ([\d.]+) param_mib ([\d.]+) grad_mib ([\d.]+) optim_mib ([\d.]+) "
                  r"transient_mib ([\d.]+) strategy (\w+) grad_dtype (\w+)")
PEER = re.compile(r"RESULT world \d+ samples_per_s (\d+) step_ms_median ([\d.]+) peak_rss_mib ([\d.]+)")


def run(argv, pattern):
    return result_line(argv, pattern, bench_env())


def ours(strategy, dtype, *extra):
    m = run([paths.DDPRUN, "--nproc_per_node=2", paths.FASHION_MNIST, *BASE, "--strategy", strategy,
             "--grad_dtype", dtype, *extra], OURS)
    return {"sps": float(m[1]), "step_ms": float(m[2]), "hidden": float(m[3]), "rss": float(m[4]),
            "held": float(m[5]) + float(m[6]) + float(m[7]), "transient": float(m[8])}


def fsdp2(hidden):
    m = run([paths.TORCH2, "torchrun", "--nproc_per_node=2", FSDP2, "--hidden", hidden, "--batch", "64",
             "--steps", "60", "--warmup", "5"], PEER)
    return {"sps": float(m[1]), "step_ms": float(m[2]), "rss": float(m[3])}


def torch2_ready():
    return os.access(os.path.join(paths.TORCH2_VENV, "bin", "torchrun"), os.X_OK)


def verdict(ok):
    return "met" if ok else "NOT met"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip PyTorch 2.15 FSDP2")
    ap.add_argument("--install-torch2", action="store_true", help="let ../shared/peers/torch2 install (about 2 GiB)")
    a = ap.parse_args()
    paths.require("sharded bench", paths.DDPRUN, paths.FASHION_MNIST)
    peer = not a.no_peer
    if peer:
        paths.require_peers("sharded bench", paths.TORCH2)
    if peer and not torch2_ready() and not a.install_torch2:
        print(f"torch2 is not installed in {paths.TORCH2_VENV}: skipping the FSDP2 peer "
              "(--install-torch2 installs it, about 2 GiB)", file=sys.stderr)
        peer = False
    configs = [(s, d) for d in ("f32", "bf16") for s in ("ddp", "zero1", "fsdp")]
    s, p = Samples(), Samples()
    for _, order in interleaved(a.runs, configs, progress=True):  # outside load hits every configuration alike
        for c in order:
            s[c].append(ours(*c))
        s["off"].append(ours("ddp", "f32", "--no-allreduce"))
        if peer:
            p["wide"].append(fsdp2("2048,2048,2048"))
            p["narrow"].append(fsdp2("2048,2048"))

    def m(key, field):
        return median([r[field] for r in s[key]])

    print(f"Fashion-MNIST MLP 784-2048-2048-2048-10, 2 workers, batch 64 per worker, AdamW, 12800 images; "
          f"medians of {a.runs} interleaved runs")
    print(f"{'strategy':>8} {'grads':>5} {'samples/s':>10} {'step ms':>8} {'hidden':>7} {'held MiB':>9} "
          f"{'transient':>10} {'rss MiB':>8}")
    for c in configs:
        print(f"{c[0]:>8} {c[1]:>5} {m(c, 'sps'):10.0f} {m(c, 'step_ms'):8.2f} {m(c, 'hidden'):7.2f} "
              f"{m(c, 'held'):9.2f} {m(c, 'transient'):10.2f} {m(c, 'rss'):8.1f}")
    print(f"{'ddp':>8} {'none':>5} {m('off', 'sps'):10.0f} {m('off', 'step_ms'):8.2f} {'':>7} "
          f"{m('off', 'held'):9.2f} {'':>10} {m('off', 'rss'):8.1f}   (--no-allreduce)")
    if peer:
        for k, name in (("wide", "784-2048-2048-2048-10"), ("narrow", "784-2048-2048-10")):
            print(f"PyTorch 2.15 FSDP2 {name}: {median([r['sps'] for r in p[k]]):.0f} samples/s, "
                  f"step {median([r['step_ms'] for r in p[k]]):.1f} ms, rss {median([r['rss'] for r in p[k]]):.1f} MiB")

    ddp, fsdp = ("ddp", "f32"), ("fsdp", "f32")
    overlap = m(ddp, "step_ms") / m("off", "step_ms")
    held = m(fsdp, "held") / m(ddp, "held")
    sps = m(fsdp, "sps") / m(ddp, "sps")
    rows = [
        ("DDP step / without reduction <= 1.10", f"{overlap:.2f}x (comm_hidden {m(ddp, 'hidden'):.2f})",
         overlap <= 1.10),
        ("FSDP/DDP held bytes <= 0.55", f"{held:.2f} ({m(fsdp, 'held'):.1f} / {m(ddp, 'held'):.1f} MiB)", held <= 0.55),
        ("FSDP peak RSS < DDP's", f"{m(fsdp, 'rss'):.1f} vs {m(ddp, 'rss'):.1f} MiB", m(fsdp, "rss") < m(ddp, "rss")),
        ("FSDP/DDP samples/s >= 0.8", f"{sps:.2f}", sps >= 0.8),
    ]
    for dtype in ("bf16",):
        b = m(("fsdp", dtype), "sps") / m(("ddp", dtype), "sps")
        rows.append((f"FSDP/DDP samples/s >= 0.8 ({dtype} grads)", f"{b:.2f}", b >= 0.8))
    if peer:
        ratio = m(fsdp, "sps") / median([r["sps"] for r in p["wide"]])
        rows.append(("ddprun FSDP / PyTorch FSDP2 samples/s >= 5", f"{ratio:.2f}x", ratio >= 5))
    print("targets:")
    for name, figure, ok in rows:
        print(f"  {name:<45} {figure:<36} {verdict(ok)}")


if __name__ == "__main__":
    main()
