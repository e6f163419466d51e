"""PyTorch 2.15 FSDP2 peer for the wide Fashion-MNIST MLP (CPU, gloo), for the target
"ddprun's FSDP >= 5x FSDP2's samples/s on the same wide MLP, batch and optimizer".

Run (2 workers; torch2 installs PyTorch 2.15 into $TORCH2_VENV on first use):
  OMP_NUM_THREADS=1 ../shared/peers/torch2 torchrun --nproc_per_node=2 \
      scripts/bench/peers/torch_fsdp2_mlp.py --hidden 2048,2048,2048 --batch 64 --steps 60 --warmup 5

The model, data and optimizer are those of examples/fashion_mnist and
../shared/peers/torch_fashion_mnist.py: an MLP 784-<hidden>-10 with ReLU between the
layers, Debian's dataset-fashion-mnist, batch --batch per worker from a shuffled
DistributedSampler (seed 0), cross-entropy, AdamW with lr --lr x world.
  --strategy fsdp2: torch.distributed.fsdp.fully_shard on each Linear, then on the
                    root (a 1-D CPU device mesh over the gloo group; defaults otherwise:
                    reshard after forward, f32 parameters and gradients).
  --strategy ddp:   torch DistributedDataParallel on the same model, for reference.

A step is timed as in examples/fashion_mnist: gathering the batch, forward, backward,
optimizer step and zero_grad. The first --warmup steps are not timed; the next --steps
are. Rank 0 prints
  RESULT world N samples_per_s S step_ms_median M peak_rss_mib R
where S counts every rank's samples over the timed steps' wall time (barriers around
them), M is the largest of the ranks' median step times (the job's pace), and R is the
largest rank's peak RSS (getrusage ru_maxrss, the dataset included). A line per rank
with its own peak RSS, before the first step and at the end, and a final loss line (a sanity check: both strategies train the
same model from the same seed) come after it.
"""
import argparse, resource, statistics, time
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from mlp_layout import widths  # the MLP's widths
from torch_mlp_common import load, mlp  # the data and model every MLP peer shares


def batches(sampler, batch):
    """Endless per-rank index batches, a new shuffle each epoch (drops a short tail)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.int64)
        for b in range(0, len(order) - batch + 1, batch):
            yield order[b:b + batch]
        epoch += 1


# ---- model ----
def wrap(model, strategy, world):
    if strategy == "ddp":
        return DDP(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=["fsdp2", "ddp"], default="fsdp2")
    p.add_argument("--hidden", default="2048,2048,2048", help="hidden widths; the model is 784-<hidden>-10")
    p.add_argument("--batch", type=int, default=64, help="per-worker batch")
    p.add_argument("--lr", type=float, default=1e-3, help="base lr, scaled by world size")
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    xtr, ytr = load("train")
    model = wrap(mlp(widths(a.hidden)), a.strategy, world)
    nparams = sum(p.numel() for p in model.parameters())  # FSDP2: DTensor numel is the full size
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr * world)
    lossf = nn.CrossEntropyLoss()
    sampler = DistributedSampler(range(len(ytr)), num_replicas=world, rank=rank, shuffle=True, seed=0)
    stream = batches(sampler, a.batch)
    setup_rss = peak_rss_mib()  # torch, the dataset and the model, before any step
    if rank == 0:
        print(f"torch_fsdp2_mlp: torch {torch.__version__}, {a.strategy}, world {world}, gloo, CPU, "
              f"{torch.get_num_threads()} thread(s); MLP 784-{a.hidden.replace(',', '-')}-10 "
              f"({nparams} parameters), batch {a.batch} per worker, AdamW lr {a.lr * world:g}; "
              f"{a.warmup} warmup + {a.steps} timed steps", flush=True)

    def step():
        i = next(stream)
        x, y = xtr[i], ytr[i]
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    for _ in range(a.warmup):
        step()
    times, loss = [], 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        ts = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - ts)
    dist.barrier()
    dt = time.perf_counter() - t0

    # Rank 0 reports: the slowest rank's median step, the largest peak RSS, the mean last loss.
    stats = torch.tensor([statistics.median(times), peak_rss_mib(), loss, setup_rss], dtype=torch.float64)
    every = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(every, stats)
    if rank == 0:
        step_ms = max(s[0].item() for s in every) * 1e3
        rss = max(s[1].item() for s in every)
        print(f"RESULT world {world} samples_per_s {world * a.batch * a.steps / dt:.0f} "
              f"step_ms_median {step_ms:.3f} peak_rss_mib {rss:.1f}", flush=True)
        for r, s in enumerate(every):
            print(f"rank {r} step_ms_median {s[0].item() * 1e3:.3f} peak_rss_mib {s[1].item():.1f} "
                  f"peak_rss_before_steps_mib {s[3].item():.1f}")
        print(f"loss after {a.warmup + a.steps} steps (mean of ranks' last batch): "
              f"{sum(s[2].item() for s in every) / world:.4f}", flush=True)
    # Both ranks leave together: a rank that tears gloo down while its peer is still
    # inside the last collective makes the peer abort (seen once in 10 runs).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
