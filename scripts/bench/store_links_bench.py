"""Store connections and threads per process of a running ddprun job (see store_links)."""
import argparse
import os
import socket
import subprocess
import time

from harness import paths
from harness.procs import bench_env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def threads(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return -1


def store_links(pid, port, sockets):
    """Established connections of `pid` whose peer is the store's port."""
    return sum(1 for line in sockets.splitlines()
               if f"pid={pid}," in line and line.split()[4].rsplit(":", 1)[1] == str(port))


def count(agents, port, wait_s):
    time.sleep(wait_s)
    sockets = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout
    rows = []
    for node, agent in enumerate(agents):
        workers = [w for w in children(agent.pid) if comm(w) == "fashion_mnist"]
        rows.append((node, store_links(agent.pid, port, sockets), threads(agent.pid),
                     [store_links(w, port, sockets) for w in workers], [threads(w) for w in workers]))
    for a in agents:
        a.terminate()
    for a in agents:
        a.wait(timeout=30)
    return rows


def one_node(wait_s):
    agent = subprocess.Popen([paths.DDPRUN, "--nproc_per_node=4", "--standalone", paths.FASHION_MNIST, "--epochs", "30"],
                             env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(wait_s / 2)
    listening = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True).stdout
    ports = [line.split()[3].rsplit(":", 1)[1] for line in listening.splitlines() if f"pid={agent.pid}," in line]
    if not ports:
        agent.terminate()
        agent.wait(timeout=30)
        raise SystemExit("store_links: ddprun listens on no port (did the job start?)")
    return count([agent], int(ports[0]), wait_s / 2)


def two_nodes(wait_s):
    port = free_port()
    env = bench_env(DDPRUN_TOKEN="store-links-bench")
    agents = [subprocess.Popen([paths.DDPRUN, "--nnodes=2", f"--node_rank={k}", "--master_addr=127.0.0.1",
                                f"--master_port={port}", "--nproc_per_node=4", paths.FASHION_MNIST, "--epochs", "30"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k in (0, 1)]
    return count(agents, port, wait_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--wait", type=float, default=8.0, help="seconds of training before counting")
    args = ap.parse_args()
    paths.require("store_links", paths.DDPRUN, paths.FASHION_MNIST)
    print("layout         node  ddprun links  ddprun threads  worker links  worker threads")
    for name, run in (("1 node x 4", one_node), ("2 nodes x 4", two_nodes)):
        for node, links, thr, wlinks, wthr in run(args.wait):
            print(f"{name:<14} {node:>4}  {links:>12}  {thr:>14}  {str(wlinks):>12}  {str(wthr):>14}")


if __name__ == "__main__":
    main()
