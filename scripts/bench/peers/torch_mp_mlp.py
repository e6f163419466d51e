"""PyTorch 2.15 peer for the model-parallel Fashion-MNIST MLP (CPU, gloo): tensor
parallelism through torch.distributed.tensor.parallel, pipeline parallelism through
torch.distributed.pipelining, for the target "ddprun's samples/s >= 3x PyTorch's on the
same model, batch and layout".

Run (torch2 installs PyTorch 2.15 into $TORCH2_VENV on first use):
  OMP_NUM_THREADS=1 ../shared/peers/torch2 torchrun --nproc_per_node=2 \
      scripts/bench/peers/torch_mp_mlp.py --mode tp --batch 64 --steps 60 --warmup 5
  OMP_NUM_THREADS=1 ../shared/peers/torch2 torchrun --nproc_per_node=2 \
      scripts/bench/peers/torch_mp_mlp.py --mode pp --schedule 1f1b --microbatches 4

The model is examples/fashion_mnist's MLP 784-<hidden>-10 (ReLU between the Linears; the
wide one, 784-2048-2048-2048-10, by default), every rank of the world in one layout:
  --mode tp  every Linear split over a 1-D CPU device mesh of the whole world
             (init_device_mesh("cpu", (world,))), ColwiseParallel and RowwiseParallel
             alternating from the first Linear (col, row, col, row, ...; an odd last
             Linear stays whole and replicated), as ddprun's make_parallel_mlp does; every
             rank feeds the same batch and computes the loss on the replicated logits.
  --mode pp  the nn.Sequential cut into `world` stages at Linear boundaries, contiguous,
             balancing parameter counts (the split that minimises the largest stage, a
             ReLU staying with the Linear before it), one PipelineStage per rank built by
             hand on its slice, ScheduleGPipe or Schedule1F1B over --microbatches, the
             cross-entropy on the last stage (the schedule averages it over micro-batches).
The data: Debian's dataset-fashion-mnist read as ../shared/peers/torch_fashion_mnist.py
reads it (pixels / 255), a batch of --batch rows per step from one shuffled order (seed 0)
that every rank draws alike; AdamW with lr --lr.

A step is timed as in examples/fashion_mnist: gathering the batch, forward, backward,
optimizer step and zero_grad. The first --warmup steps are not timed; the next --steps
are. Rank 0 prints a line naming the layout (each Linear's placement under tp, each
stage's Linears under pp), then
  RESULT mode M world N samples_per_s S step_ms_median T loss_first L0 loss_last L1 params_per_rank P0,P1,...
where S is the batch's rows (one batch per step for the whole world: the ranks share it)
times the timed steps over their wall time (barriers around them), T the largest of the
ranks' median step times, L0 and L1 the mean loss of the first and last 10 steps (a check
that it trains) and Pr the parameters rank r holds (its shards or its stage).
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from mlp_layout import partition, widths  # the stages' split, as partition_layers cuts them
from torch_mlp_common import load, mlp  # the data and model every MLP peer shares


def batches(rows, batch):
    """Endless index batches, a new shuffle (seed 0, then 1, ...) each pass; the same on every rank."""
    epoch = 0
    while True:
        g = torch.Generator()
        g.manual_seed(epoch)
        order = torch.randperm(rows, generator=g)
        for b in range(0, rows - batch + 1, batch):
            yield order[b:b + batch]
        epoch += 1


# ---- model ----
def stage_module(model, first, end, n_linears):
    """The Sequential's slice holding Linears [first, end) and the ReLU after each but the last Linear."""
    begin = 2 * first
    stop = 2 * end - 1 if end == n_linears else 2 * end
    return model[begin:stop]


def tp_model(model, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    linears = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    plan, names = {}, []
    for k in range(0, len(linears) - 1, 2):  # pairs: column then row; an odd last one stays whole
        plan[str(linears[k])] = ColwiseParallel()
        plan[str(linears[k + 1])] = RowwiseParallel()
        names += ["col", "row"]
    if len(linears) % 2:
        names.append("whole")
    parallelize_module(model, mesh, plan)
    # What each Linear's weight became (Shard(0): rows split, Shard(1): columns split).
    placed = [str(getattr(model[i].weight, "placements", ("whole",))[0]) for i in linears]
    return model, f"tp {world}: " + ",".join(f"{n} {w}" for n, w in zip(names, placed))


def local_numel(p):
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["tp", "pp"], required=True)
    p.add_argument("--hidden", default="2048,2048,2048", help="hidden widths; the model is 784-<hidden>-10")
    p.add_argument("--batch", type=int, default=64, help="rows per step (the whole world's batch)")
    p.add_argument("--microbatches", type=int, default=4, help="pp: micro-batches per step")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe", help="pp: the schedule")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--limit-train", type=int, default=0, help="use only the first N training images")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    xtr, ytr = load("train", a.limit_train)
    dims = widths(a.hidden)
    model = mlp(dims)  # every rank builds the whole model from seed 0, then keeps its part
    n_linears = len(dims) - 1
    lossf = nn.CrossEntropyLoss()

    if a.mode == "tp":
        model, layout = tp_model(model, world)
        first = last = True
        schedule = None
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        try:
            ranges = partition(dims, world)
        except ValueError as e:
            raise SystemExit(f"torch_mp_mlp: {e}")
        f, e = ranges[rank]
        model = stage_module(model, f, e, n_linears)
        stage = PipelineStage(model, rank, world, torch.device("cpu"))
        kind = ScheduleGPipe if a.schedule == "gpipe" else Schedule1F1B
        schedule = kind(stage, n_microbatches=a.microbatches, loss_fn=lossf)
        first, last = rank == 0, rank == world - 1
        layout = f"pp {world} {a.schedule} m {a.microbatches}: " + ",".join(f"[{b},{c})" for b, c in ranges)
    held = sum(local_numel(q) for q in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    stream = batches(len(ytr), a.batch)

    def step():
        i = next(stream)
        x, y = xtr[i], ytr[i]
        if schedule is None:
            loss = lossf(model(x), y)
            loss.backward()
            value = loss.item()
        else:
            losses = []
            if first:
                schedule.step(x)
            elif last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            value = torch.stack(losses).mean().item() if last else 0.0
        opt.step()
        opt.zero_grad()
        return value

    losses = []
    for _ in range(a.warmup):
        losses.append(step())
    times = []
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        ts = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - ts)
    dist.barrier()
    dt = time.perf_counter() - t0

    k = min(10, len(losses))
    stats = torch.tensor([statistics.median(times), sum(losses[:k]) / k, sum(losses[-k:]) / k, held, float(last)],
                         dtype=torch.float64)
    every = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(every, stats)
    if rank == 0:
        lossy = [s for s in every if s[4].item() > 0]  # the ranks that see the loss: all (tp) or the last stage
        step_ms = max(s[0].item() for s in every) * 1e3
        print(f"torch_mp_mlp: torch {torch.__version__}, world {world}, gloo, CPU, {torch.get_num_threads()} "
              f"thread(s); MLP {'-'.join(map(str, dims))}, batch {a.batch}, AdamW lr {a.lr:g}; "
              f"{a.warmup} warmup + {a.steps} timed steps; {layout}", flush=True)
        print(f"RESULT mode {a.mode} world {world} samples_per_s {a.batch * a.steps / dt:.0f} "
              f"step_ms_median {step_ms:.3f} loss_first {lossy[0][1].item():.4f} "
              f"loss_last {lossy[0][2].item():.4f} params_per_rank "
              f"{','.join(str(int(s[3].item())) for s in every)}", flush=True)
    dist.barrier()  # leave together: gloo aborts a peer still inside the last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
