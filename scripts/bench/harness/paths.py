"""Where the benchmarks find what they run: the build (BUILD_DIR, default build/), the
peers (DDPRUN_PEERS_DIR, default ../shared/peers) and the scripts beside them."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BENCH_DIR = os.path.join(ROOT, "scripts", "bench")
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
PEERS = os.environ.get("DDPRUN_PEERS_DIR", os.path.join(ROOT, "..", "shared", "peers"))

PY = "/usr/bin/python3"  # Debian's Python, with python3-torch (torch 1.13): the torchrun/gloo peers
TORCHRUN_PY = os.path.join(PEERS, "torchrun.py")  # Debian's torchrun, fixed for Python 3.11
TORCH2 = os.path.join(PEERS, "torch2")  # torch 2.15 in a venv of its own (../shared/peers/README.md)
TORCH2_VENV = os.environ.get("TORCH2_VENV", os.path.expanduser("~/.cache/ddprun-peers/torch2"))


def built(*parts):
    return os.path.join(BUILD, *parts)


DDPRUN = built("launcher", "ddprun")
DAEMON = built("rendezvous", "ddp-rendezvous")
STORE_BENCH = built("scripts/bench", "ddp-store-bench")
TORCH_STORE_LOAD = built("scripts/bench", "ddp-torch-store-load")
DDP_BENCH = built("worker_runtime", "ddp-bench")
FASHION_MNIST = built("examples", "fashion_mnist", "fashion_mnist")
TEST_WORKER = built("tests", "test_worker")
EXIT_WORKER = built("tests", "exit_worker")
COLLECTIVE_WORKER = built("tests", "collective_worker")


def require(who, *programs):
    """Exits with one line naming the first of `programs` that is not an executable file."""
    for path in programs:
        if not os.access(path, os.X_OK):
            sys.exit(f"{who}: {path} is missing: build first (scripts/setup; BUILD_DIR names another build)")


def require_root(who, why="network namespaces"):
    if os.geteuid() != 0:
        sys.exit(f"{who}: needs root ({why})")


def require_peers(who, *files):
    """Exits with one line naming the first of the peers' `files` that is missing."""
    for path in files:
        if not os.path.exists(path):
            sys.exit(f"{who}: the peer {path} is missing (DDPRUN_PEERS_DIR names the peers' folder, "
                     "default ../shared/peers beside the checkout)")
