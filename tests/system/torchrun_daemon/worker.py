"""The training program of the torchrun-through-ddp-rendezvous test: an unmodified torch
script as torchrun starts it (init_process_group("gloo") from the environment).

    worker.py [--fail_once DIR] [--until_world W] [--linger S]

It joins the process group, all-reduces rank + 1 and prints one line:

  TRD_WORKER host=H rank=R world=W local_rank=L group_rank=G restarts=C first=0|1
             master=ADDR:PORT agent_store=True|False sum=S t=<time.time() after the all-reduce>

then exits 0, except:
  --fail_once DIR  on the first attempt (DIR/failed absent when this worker started) the
                   last rank prints "TRD_FAIL t=<time.time()>", creates DIR/failed and exits 3
                   (scripts/bench/torchrun_daemon times the re-form from there), the others wait
                   to be stopped
                   by their agent's re-form; later attempts exit 0.
  --until_world W  a world smaller than W waits to be stopped (a node is still to join).
A waiting worker gives up after --linger seconds (a safety net: the test fails first).
"""
import argparse
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fail_once")
    ap.add_argument("--until_world", type=int, default=0)
    ap.add_argument("--linger", type=float, default=120.0)
    a = ap.parse_args()
    first = a.fail_once is not None and not os.path.exists(os.path.join(a.fail_once, "failed"))

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t)
    env = os.environ.get
    print(f"TRD_WORKER host={socket.gethostname()} rank={rank} world={world} local_rank={env('LOCAL_RANK')} "
          f"group_rank={env('GROUP_RANK')} restarts={env('TORCHELASTIC_RESTART_COUNT')} first={int(first)} "
          f"master={env('MASTER_ADDR')}:{env('MASTER_PORT')} agent_store={env('TORCHELASTIC_USE_AGENT_STORE')} "
          f"sum={int(t.item())} t={time.time():.6f}", flush=True)

    if first and rank == world - 1:
        print(f"TRD_FAIL t={time.time():.6f}", flush=True)
        open(os.path.join(a.fail_once, "failed"), "w").close()
        sys.exit(3)
    if first or world < a.until_world:
        time.sleep(a.linger)  # the agent stops this worker when it re-forms the round
        sys.exit(4)
    dist.barrier()  # nobody leaves before every rank printed
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
