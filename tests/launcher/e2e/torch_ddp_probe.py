"""An unmodified PyTorch DDP script: env:// rendezvous through MASTER_ADDR/PORT
(torch's TCPStore on MASTER_PORT: the launcher's agent store, or rank 0's own),
a gloo all_reduce, one DDP step.
Prints one line per rank that the test checks."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)

    torch.manual_seed(rank)  # different init per rank: DDP must broadcast rank 0's
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.full((8, 4), float(rank))
    model(x).sum().backward()
    opt.step()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank={rank} world={world} allreduce={t.item():g} checksum={checksum:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
