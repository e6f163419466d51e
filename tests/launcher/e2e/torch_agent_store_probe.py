"""A seeds-style PyTorch DDP script (init from the environment, DistributedSampler,
DDP, gloo) plus the checks of the agent store: TORCHELASTIC_USE_AGENT_STORE=True,
MASTER_PORT served by the launcher (the worker's parent), no worker listening on
it, and a torch client of attempt N seeing neither the agents' keys nor attempt
N-1's. Runs with torch 1.13 and 2.x alike.

    probe.py [--kill-rank0-attempt N] [--stamp]

--kill-rank0-attempt N: rank 0 of attempt N (TORCHELASTIC_RESTART_COUNT) kills
itself with SIGKILL once init and one all_reduce are done, so the launcher restarts.
--stamp: every rank prints "init_done <wall-clock seconds>" when init returns.
Prints "rank=R attempt=A master_port=P listener=launcher ... loss=L" per rank.
"""
import argparse
import datetime
import os
import signal
import socket
import struct
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def listening_inodes(port):
    """Inodes of the sockets listening on `port` in this network namespace."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                found.add(inode)
    return found


def socket_inodes(pid):
    """Inodes of the sockets process `pid` holds."""
    out = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def who_listens(port):
    """'launcher' when the parent process alone holds the listener on `port`."""
    inodes = listening_inodes(port)
    if not inodes:
        return "nobody"
    if inodes & socket_inodes(os.getpid()):
        return "this-worker"
    if inodes & socket_inodes(os.getppid()):
        return "launcher"
    return "another-process"


def raw_add(key, delta):
    """ADD as torch 2.x's client sends it (VALIDATE, then ADD), but with `key` exactly as
    given: torch's own client puts "/" before every key, so it could never name an agent's
    key even in the agents' namespace. Any 2.x TCPStore server answers it (torchrun's agent
    store too). Returns the counter's new value."""
    data = key.encode()
    validate = bytes([0]) + struct.pack("<I", 0x3C85F7CE)  # 0: VALIDATE, torch's magic
    request = validate + bytes([4]) + struct.pack("<Q", len(data)) + data + struct.pack("<q", delta)  # 4: ADD
    with socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=30) as s:
        s.sendall(request)
        reply = b""
        while len(reply) < 8:
            chunk = s.recv(8 - len(reply))
            if not chunk:
                raise RuntimeError("the store closed the connection before answering ADD")
            reply += chunk
    return struct.unpack("<q", reply)[0]


def raw_client():
    """A torch TCPStore client on MASTER_ADDR:MASTER_PORT, without the prefix torch adds."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                         datetime.timedelta(seconds=30))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank0-attempt", type=int, default=-1)
    parser.add_argument("--stamp", action="store_true")
    args = parser.parse_args()

    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True", os.environ["TORCHELASTIC_USE_AGENT_STORE"]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    port = int(os.environ["MASTER_PORT"])

    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    if args.stamp:
        print(f"init_done {time.time():.6f}", flush=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    listener = who_listens(port)

    # What a torch client sees: this attempt's keys only (the launcher's own, such as
    # its count of attempt 0's worker exits, and the previous attempt's are in other
    # namespaces). Counters, read with add(key, 0) (1.13's TCPStore has no check()).
    store = raw_client()
    if rank == 0:
        store.add(f"probe/attempt_{attempt}", 1)
    dist.barrier()
    own = store.add(f"probe/attempt_{attempt}", 0) == 1
    earlier = attempt > 0 and store.add(f"probe/attempt_{attempt - 1}", 0) != 0
    agents = raw_add("attempt/0/exits", 0) != 0  # the agents count attempt 0's worker exits there

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if rank == 0 and attempt == args.kill_rank0_attempt:
        os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    torch.manual_seed(rank)  # different init per rank: DDP must broadcast rank 0's
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.tensor(0.0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank={rank} world={world} attempt={attempt} master_port={port} listener={listener} "
          f"own_key={own} earlier_key={bool(earlier)} agent_keys={agents} allreduce={t.item():g} "
          f"checksum={checksum:.10f} loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
