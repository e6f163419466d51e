"""The training job of scripts/bench/elastic: a tiny torch DDP model (gloo, CPU) that trains
step after step until it is stopped, launched unchanged by ddprun and by torchrun.

Right after init_process_group returns (gloo has then connected to every peer of this
attempt) each worker prints one line the benchmark parses:

  ELASTIC_READY rank=R world=W restarts=C group_rank=G group_world=N pid=P t=<wall clock s>

so "running again" means the same thing under both launchers. The steps that follow keep
an all-reduce in flight most of the time, so a lost peer makes the survivors' collectives
fail, as in real training.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--step_sleep", type=float, default=0.02,
                    help="seconds between steps, so that three nodes' workers leave the 2 cores some air")
    ap.add_argument("--pg_timeout", type=float, default=60.0, help="process group timeout, seconds")
    ap.add_argument("--max_seconds", type=float, default=900.0,
                    help="a safety net only: the benchmark stops the job long before")
    a = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
    env = os.environ.get
    print(f"ELASTIC_READY rank={dist.get_rank()} world={dist.get_world_size()} "
          f"restarts={env('TORCHELASTIC_RESTART_COUNT', '-1')} group_rank={env('GROUP_RANK', '-1')} "
          f"group_world={env('GROUP_WORLD_SIZE', '-1')} pid={os.getpid()} t={time.time():.6f}", flush=True)

    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + a.max_seconds
    while time.monotonic() < deadline:
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # the gradient all-reduce: fails (or waits) when a peer is gone
        opt.step()
        time.sleep(a.step_sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
