"""The pipeline's bubble for scripts/bench/model_parallel: the schedules' theory and a
replay of the operations a run's trace recorded.

Terms: p stages, m micro-batches; F and B a stage's forward and backward of one
micro-batch; a stage's idle share is the part of the step it spends not computing, and
the pipeline's is the mean over its stages (what examples/fashion_mnist reports as
pipe_idle, from each stage's own blocked time).

  theory(p, m)          (p-1)/(m+p-1): GPipe's and 1F1B's bubble with equal stages and
                        free communication.
  weighted(costs, m)    the same schedules with stages of unequal cost (costs per stage,
                        e.g. their parameter counts as a stand-in for their FLOPs): the
                        slowest stage paces the steady state, so the step is
                        (m-1)*max(c) + sum(c) in units of F+B, and a stage of cost c is
                        busy m*c of it.
  replay(trace, p, m)   each step's F and B operations as the trace recorded them, in each
                        stage's own order, replayed with free communication and a core per
                        stage: with each operation's measured duration (preemption of an
                        operation still delays the others), and with every operation of a
                        stage at that stage's median (the schedule's bubble given the
                        stages' typical costs, without the wall-clock distortion of more
                        processes than cores).
"""
import json
import re
import statistics

# The pipeline's compute events (ddp::Pipeline with a Trace): "F<i>", "B<i>", "loss<i>".
OP = re.compile(r"^(F|B|loss)(\d+)$")


def theory(p, m):
    return (p - 1) / (m + p - 1)


def weighted(costs, m):
    step = (m - 1) * max(costs) + sum(costs)
    return statistics.mean(1 - m * c / step for c in costs)


def stage_ops(path):
    """Per rank (pid), its compute operations in time order: [(kind, micro, seconds)], a
    last stage's loss folded into the forward before it."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ranks = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and e.get("tid") == 0), key=lambda e: e["ts"]):
        m = OP.match(e["name"])
        if not m:
            continue
        ops = ranks.setdefault(e["pid"], [])
        kind, micro, dur = m[1], int(m[2]), e["dur"] * 1e-6
        if kind == "loss":
            if ops and ops[-1][0] == "F" and ops[-1][1] == micro:
                ops[-1] = ("F", micro, ops[-1][2] + dur)
            continue
        ops.append((kind, micro, dur))
    return ranks


def replay_step(ops):
    """ops[s]: stage s's operations of one step, in its order. The step's idle share with
    free communication: F(s, i) waits for F(s-1, i), B(s, i) for B(s+1, i), each stage runs
    its operations one at a time in its recorded order."""
    p = len(ops)
    end = {}  # (kind, stage, micro) -> finish time
    free = [0.0] * p
    nxt = [0] * p
    left = sum(len(o) for o in ops)
    while left:
        moved = False
        for s in range(p):
            while nxt[s] < len(ops[s]):
                kind, i, dur = ops[s][nxt[s]]
                dep = ("F", s - 1, i) if kind == "F" and s > 0 else ("B", s + 1, i) if kind == "B" and s < p - 1 else None
                if dep is not None and dep not in end:
                    break
                start = max(free[s], end[dep] if dep else 0.0)
                free[s] = end[(kind, s, i)] = start + dur
                nxt[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("replay: the recorded orders wait on each other (not one schedule's steps)")
    step = max(free)
    return statistics.mean(1 - sum(d for _, _, d in o) / step for o in ops)


def replay(path, p, m, skip=1):
    """Two replays of a run's trace, the first `skip` steps left out (warm-up):
      per_op:  the median over steps of the idle share replayed with each operation's own
               duration (a preempted operation delays its successors as in the run);
      typical: one step replayed in its recorded orders with every forward and every
               backward of a stage at that stage's median duration (the schedule's bubble
               with the stages' typical costs, preemption left out).
    Each stage's operations are cut into steps of 2m (m forwards, m backwards): the runs
    must have full batches. Returns (per_op, typical, steps replayed)."""
    ranks = stage_ops(path)
    if sorted(ranks) != list(range(p)):
        raise ValueError(f"replay: the trace has ranks {sorted(ranks)}, expected 0..{p - 1}")
    per = 2 * m
    steps = min(len(o) for o in ranks.values()) // per
    cut = [[ranks[s][k * per:(k + 1) * per] for s in range(p)] for k in range(skip, steps)]
    if not cut:
        raise ValueError(f"replay: {steps} step(s) in the trace, none past the first {skip}")
    typical = {(s, kind): statistics.median(d for step in cut for k, _, d in step[s] if k == kind)
               for s in range(p) for kind in ("F", "B")}
    even = [[(k, i, typical[(s, k)]) for k, i, _ in cut[0][s]] for s in range(p)]
    return statistics.median(replay_step(step) for step in cut), replay_step(even), len(cut)
