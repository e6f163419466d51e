"""The benchmark behind scripts/bench/model_parallel (see there)."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import model_parallel_bubble as bubble
from harness import paths
from harness.procs import bench_env, result_line
from harness.runs import Samples, figures, interleaved
from peers.mlp_layout import stage_params

PEER = os.path.join(paths.BENCH_DIR, "peers", "torch_mp_mlp.py")
WIDE = "2048,2048,2048"
BALANCED = ",".join(["784"] * 8)  # 9 Linears of 615k parameters but the last: pp 4 cuts them 2, 2, 2, 3
MODELS = {"wide": WIDE, "balanced": BALANCED}
# The example's RESULT line and the peer's are "key value" pairs after RESULT.
RESULT = re.compile(r"^(?:\[rank0\]:)?RESULT (.*)$", re.M)
LAYOUT = re.compile(r"^(tp|pp)(\d+)(?:-(gpipe|1f1b))?$")


class Layout:
    """"tp2", "pp4-1f1b", ...: every worker in one tensor-parallel group or one pipeline."""

    def __init__(self, name):
        m = LAYOUT.match(name)
        if not m or int(m[2]) < 2 or (m[1] == "pp") != (m[3] is not None):
            sys.exit(f"model_parallel bench: layout '{name}' is not tpN or ppN-gpipe|ppN-1f1b (N >= 2)")
        self.name, self.mode, self.world, self.schedule = name, m[1], int(m[2]), m[3]

    def ours(self, microbatches):
        flags = ["--tp", str(self.world)] if self.mode == "tp" else ["--pp", str(self.world)]
        if self.mode == "pp":
            flags += ["--microbatches", str(microbatches), "--schedule", self.schedule]
        return flags

    def peer(self, microbatches):
        flags = ["--mode", self.mode]
        if self.mode == "pp":
            flags += ["--microbatches", str(microbatches), "--schedule", self.schedule]
        return flags


def fields(text):
    """The "key value" pairs of a RESULT line's text, numbers as floats."""
    words = text.split()
    out = {}
    for k, v in zip(words[::2], words[1::2]):
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def example(world, hidden, batch, rows, flags, trace=None):
    """One run of examples/fashion_mnist under ddprun: its RESULT fields."""
    argv = [paths.DDPRUN, f"--nproc_per_node={world}", paths.FASHION_MNIST, "--hidden", hidden, "--epochs", "1",
            "--limit-train", str(rows), "--no-eval", "--batch", str(batch), *flags]
    if trace:
        argv += ["--trace", trace]
    f = fields(result_line(argv, RESULT, bench_env())[1])
    if world > 1 and "pipe_idle" not in f:
        sys.exit("model_parallel bench: the example's RESULT line has no tp/pp/pipe_idle fields: it predates --tp/--pp")
    return f


def torch_peer(layout, hidden, batch, microbatches, steps, warmup):
    argv = [paths.TORCH2, "torchrun", f"--nproc_per_node={layout.world}", PEER, *layout.peer(microbatches),
            "--hidden", hidden, "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup)]
    return fields(result_line(argv, RESULT, bench_env())[1])


def torch2_ready():
    return os.access(os.path.join(paths.TORCH2_VENV, "bin", "torchrun"), os.X_OK)


def verdict(ok):
    return "met" if ok else "NOT met"


def spread(values, fmt="{:.0f}"):
    f = figures(values)
    return f"{fmt.format(f.median)} ({fmt.format(f.min)}-{fmt.format(f.max)})"


# ---- samples/s against PyTorch 2.15 ----
def throughput(a, peer, out):
    layouts = [Layout(n) for n in a.layouts.split(",")]
    s, p = Samples(), Samples()
    for _, order in interleaved(a.runs, layouts, alternate=True, progress=True):
        for lay in order:  # ours then torch's, in turn: outside load hits both alike
            s[lay.name].append(example(lay.world, WIDE, a.batch, a.batch * a.steps, lay.ours(a.microbatches)))
            if peer:
                p[lay.name].append(torch_peer(lay, WIDE, a.batch, a.microbatches, a.peer_steps, a.peer_warmup))
    print(f"\n== samples/s: MLP 784-{WIDE.replace(',', '-')}-10, batch {a.batch} per step (dp 1: every worker in the "
          f"one tp group or pipeline), micro-batches {a.microbatches}, AdamW, OMP_NUM_THREADS=1 on both sides; "
          f"ddprun {a.steps} steps (one epoch of --limit-train {a.batch * a.steps}), torch {a.peer_warmup} warm-up + "
          f"{a.peer_steps} timed steps; medians (min-max) of {a.runs} interleaved runs")
    print(f"{'layout':>10} {'workers':>7} {'ddprun':>18} {'torch 2.15':>18} {'ratio':>6} {'pipe_idle':>9} "
          f"{'torch loss first->last':>22}")
    rows = []
    for lay in layouts:
        ours = [r["samples_per_s"] for r in s[lay.name]]
        row = {"layout": lay.name, "workers": lay.world, "ddprun_samples_per_s": ours,
               "pipe_idle": [r["pipe_idle"] for r in s[lay.name]]}
        line = f"{lay.name:>10} {lay.world:>7} {spread(ours):>18}"
        if peer:
            theirs = [r["samples_per_s"] for r in p[lay.name]]
            ratio = figures(ours).median / figures(theirs).median
            losses = [(r["loss_first"], r["loss_last"]) for r in p[lay.name]]
            row.update(torch_samples_per_s=theirs, ratio=ratio, torch_loss=losses)
            fell = all(b < f for f, b in losses)
            line += (f" {spread(theirs):>18} {ratio:6.2f} {figures(row['pipe_idle']).median:9.3f} "
                     f"{losses[0][0]:.3f}->{losses[0][1]:.3f}{'' if fell else ' (did not fall!)'}")
        else:
            line += f" {'':>18} {'':>6} {figures(row['pipe_idle']).median:9.3f}"
        print(line)
        rows.append(row)
    out["throughput"] = rows
    return [(f"{r['layout']}: ddprun / torch 2.15 samples/s >= 3", f"{r['ratio']:.2f}x", r["ratio"] >= 3)
            for r in rows if "ratio" in r]


# ---- the pipeline's idle share against the schedules' bubble ----
def idle(a, out):
    """The pipeline's idle share per (stages, model, schedule, m); targets for the issue's
    4-stage rows, other stage counts shown beside them."""
    configs = [(p, model, sched, m) for p in (int(x) for x in a.idle_stages.split(","))
               for model in a.idle_models.split(",") for sched in ("gpipe", "1f1b")
               for m in (int(x) for x in a.idle_microbatches.split(","))]
    measured, per_op, typical = Samples(), Samples(), Samples()
    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        for _, order in interleaved(a.idle_runs, configs, alternate=True, progress=True):
            for c in order:
                p, model, sched, m = c
                trace = os.path.join(tmp, "trace.json")
                r = example(p, MODELS[model], a.idle_batch, a.idle_batch * a.idle_steps,
                            ["--pp", str(p), "--microbatches", str(m), "--schedule", sched], trace=trace)
                measured[c].append(r["pipe_idle"])
                try:
                    one, even, _ = bubble.replay(trace, p, m)
                    per_op[c].append(one)
                    typical[c].append(even)
                except (ValueError, OSError, KeyError) as e:
                    print(f"  replay of {c}: {e}", file=sys.stderr)
    print(f"\n== pipeline idle share: ppP with P workers on {os.cpu_count()} cores, batch {a.idle_batch}, "
          f"{a.idle_steps} steps a run (the first left out of the replays), medians (min-max) of {a.idle_runs} runs; "
          f"'measured': the example's pipe_idle (each stage's blocked share of its step, mean over stages); theory "
          f"(p-1)/(m+p-1); 'weighted': the same schedules with the stages' parameter counts as their costs; "
          f"'replay op': each step's traced F/B durations replayed with free communication and a core per stage; "
          f"'replay typ': every F and B of a stage at its median duration; rel err against theory")
    print(f"{'pp':>2} {'model':>8} {'stage params':>24} {'sched':>5} {'m':>3} {'measured':>19} {'theory':>6} "
          f"{'rel err':>7} {'weighted':>8} {'replay op':>9} {'replay typ':>10} {'rel err':>7}")
    rows, targets = [], []
    for c in configs:
        p, model, sched, m = c
        costs = stage_params(MODELS[model], p)
        th = bubble.theory(p, m)
        got = figures(measured[c]).median
        row = {"stages": p, "model": model, "hidden": MODELS[model], "stage_params": costs, "schedule": sched,
               "m": m, "measured": measured[c], "theory": th, "weighted": bubble.weighted(costs, m),
               "replay_per_op": per_op[c], "replay_typical": typical[c], "rel_err": (got - th) / th}
        rep = f"{figures(per_op[c]).median:9.3f} {figures(typical[c]).median:10.3f} " \
              f"{(figures(typical[c]).median - th) / th:+7.1%}" if typical[c] else f"{'(no trace)':>28}"
        print(f"{p:>2} {model:>8} {','.join(f'{x / 1e6:.2f}M' for x in costs):>24} {sched:>5} {m:>3} "
              f"{spread(measured[c], '{:.3f}'):>19} {th:6.3f} {row['rel_err']:+7.1%} {row['weighted']:8.3f} {rep}")
        rows.append(row)
        if p == 4:
            targets.append((f"idle pp4 {model} {sched} m {m}: within 10% of theory", f"{got:.3f} vs {th:.3f} "
                            f"({row['rel_err']:+.1%})", abs(row["rel_err"]) <= 0.10))
    out["idle"] = rows
    return targets


# ---- parameter + gradient + optimizer bytes per rank ----
BYTES_LAYOUTS = [("wide", 2, 1), ("wide", 4, 1), ("wide", 1, 2), ("wide", 1, 4), ("wide", 2, 2),
                 ("balanced", 1, 2), ("balanced", 1, 4)]


def held_bytes(a):
    print("\n== bytes per rank: parameters + gradients + AdamW state, the largest rank's (held_bytes), against "
          "the unsplit model at world 1 (one step each: the figures do not depend on time)")
    print(f"{'model':>8} {'tp':>3} {'pp':>3} {'bytes':>12} {'unsplit':>12} {'ratio':>7} {'bound':>7}")
    unsplit, rows, targets = {}, [], []
    for model, tp, pp in BYTES_LAYOUTS:
        hidden = MODELS[model]
        if model not in unsplit:
            unsplit[model] = example(1, hidden, a.batch, a.batch, [])
        base = unsplit[model].get("held_bytes")
        if base is None:  # an example without held_bytes: its MiB fields
            base = sum(unsplit[model][k] for k in ("param_mib", "grad_mib", "optim_mib")) * 2 ** 20
        r = example(tp * pp, hidden, a.batch, a.batch, ["--tp", str(tp), "--pp", str(pp)] +
                    (["--microbatches", "2"] if pp > 1 else []))
        ratio, bound = r["held_bytes"] / base, 1.05 / (tp * pp)
        print(f"{model:>8} {tp:>3} {pp:>3} {r['held_bytes']:12.0f} {base:12.0f} {ratio:7.4f} {bound:7.4f}")
        rows.append({"model": model, "tp": tp, "pp": pp, "held_bytes": r["held_bytes"], "unsplit": base,
                     "ratio": ratio, "bound": bound})
        targets.append((f"bytes {model} tp {tp} pp {pp}: <= (1/tp)(1/pp) + 5%", f"{ratio:.4f} vs {bound:.4f}",
                        ratio <= bound))
    return rows, targets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="runs of the samples/s comparison")
    ap.add_argument("--sections", default="throughput,idle,bytes")
    ap.add_argument("--layouts", default="tp2,pp2-gpipe,pp2-1f1b", help="also tp4, pp4-gpipe, pp4-1f1b (4 workers)")
    ap.add_argument("--batch", type=int, default=64, help="rows per step (dp 1: the whole job's batch)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100, help="ddprun's steps a run (--limit-train = batch x steps)")
    ap.add_argument("--peer-steps", type=int, default=40, help="torch's timed steps a run")
    ap.add_argument("--peer-warmup", type=int, default=5)
    ap.add_argument("--idle-stages", default="4,2", help="pipeline depths (the target is on 4; 2 puts one worker "
                    "per core)")
    ap.add_argument("--idle-microbatches", default="4,8,16")
    ap.add_argument("--idle-models", default="wide,balanced",
                    help=f"wide: 784-{WIDE}-10; balanced: 784-{BALANCED}-10, equal stages at pp 4")
    ap.add_argument("--idle-batch", type=int, default=1024, help="rows per step: 64 per micro-batch at m 16")
    ap.add_argument("--idle-steps", type=int, default=6)
    ap.add_argument("--idle-runs", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip PyTorch 2.15")
    ap.add_argument("--install-torch2", action="store_true", help="let ../shared/peers/torch2 install (about 2 GiB)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--smoke", action="store_true",
                    help="a check, not a measurement: ddprun only, once, a few steps of tp2 and pp2-1f1b, pp 4 idle "
                         "at m 4 (wide), the bytes rows; exits non-zero when a run fails")
    a = ap.parse_args()
    if a.smoke:
        a.runs, a.idle_runs, a.no_peer, a.steps, a.idle_steps = 1, 1, True, 4, 3
        a.layouts, a.idle_microbatches, a.idle_models, a.idle_batch = "tp2,pp2-1f1b", "4", "wide", 64
        a.idle_stages = "4"
    sections = set(a.sections.split(","))
    if sections - {"throughput", "idle", "bytes"}:
        sys.exit(f"model_parallel bench: unknown sections {sorted(sections - {'throughput', 'idle', 'bytes'})}")
    paths.require("model_parallel bench", paths.DDPRUN, paths.FASHION_MNIST)
    peer = not a.no_peer and "throughput" in sections
    if peer:
        paths.require_peers("model_parallel bench", paths.TORCH2)
        if not torch2_ready() and not a.install_torch2:
            print(f"torch2 is not installed in {paths.TORCH2_VENV}: skipping the PyTorch 2.15 peer "
                  "(--install-torch2 installs it, about 2 GiB)", file=sys.stderr)
            peer = False
    out, targets = {"args": vars(a), "cores": os.cpu_count()}, []
    if "throughput" in sections:
        targets += throughput(a, peer, out)
    if "idle" in sections:
        targets += idle(a, out)
    if "bytes" in sections:
        out["bytes"], t = held_bytes(a)
        targets += t
    print("\ntargets:")
    for name, figure, ok in targets:
        print(f"  {name:<52} {figure:<28} {verdict(ok)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"figures written to {a.json}")


if __name__ == "__main__":
    try:
        main()
    except subprocess.SubprocessError as e:
        sys.exit(f"model_parallel bench: {e}")
