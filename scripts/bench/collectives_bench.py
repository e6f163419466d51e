"""The benchmark behind scripts/bench/collectives (see there)."""
import argparse
import os
import re
import subprocess
import sys
import tempfile

from harness import paths
from harness.hosts import Hosts
from harness.procs import bench_env, output
from harness.runs import figures, interleaved, median

KiB, MiB = 1024, 1024 * 1024
SIZES = [4 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
ENV = bench_env()


def sh(argv):
    return output(argv, ENV)


def mpi_binary(tmp):
    # The peer as given, with 64 KiB added to its sizes (the range starts there).
    src = open(os.path.join(paths.PEERS, "mpi_allreduce.c")).read()
    src = src.replace("long sizes[]={1<<10,1<<16,1<<20,1<<22,1<<24};",
                      "long sizes[]={1<<10,1<<14,1<<16,1<<18,1<<20,1<<22,1<<24};")
    src = src.replace("for(int s=0;s<5;s++)", "for(int s=0;s<7;s++)")
    path = os.path.join(tmp, "mpi_allreduce.c")
    open(path, "w").write(src)
    sh(["mpicc", "-O2", path, "-o", os.path.join(tmp, "mpi_allreduce")])
    return os.path.join(tmp, "mpi_allreduce")


def parse_peer(text):
    out = {}
    for m in re.finditer(r"bytes=\s*(\d+) time_us=\s*([\d.]+) algbw=\s*([\d.]+)(?: GB/s)? busbw=\s*([\d.]+)", text):
        out[int(m[1])] = (float(m[2]), float(m[4]))
    return out


def parse_ddp(text):
    out = {}
    for m in re.finditer(r"all_reduce\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", text):
        if m[5] != "0":
            sys.exit(f"ddp-bench reported wrong results:\n{text}")
        out[int(m[1])] = (float(m[2]), float(m[4]))
    return out


def run_ddp(prefix=()):
    return parse_ddp(sh([*prefix, paths.DDPRUN, "--nproc_per_node=2", paths.DDP_BENCH, "-b", "4K", "-e", "64M",
                         "-f", "2"]))


def run_mpi(binary):
    return parse_peer(sh(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", binary]))


def run_gloo():
    return parse_peer(sh([paths.PY, paths.TORCHRUN_PY, "--nproc_per_node=2", "--monitor_interval", "0.1",
                          os.path.join(paths.PEERS, "gloo_allreduce.py")]))


def med(samples, size, col):
    vals = [s[size][col] for s in samples if size in s]
    return median(vals) if vals else float("nan")


def one_host(runs):
    with tempfile.TemporaryDirectory() as tmp:
        mpi = mpi_binary(tmp)
        ddp, mpis, gloo = [], [], []
        for _ in interleaved(runs, progress=True):  # so load from outside hits all three alike
            ddp.append(run_ddp())
            mpis.append(run_mpi(mpi))
            gloo.append(run_gloo())
    print(f"2 ranks, one host, f32 sum all-reduce; medians of {runs} interleaved runs; busbw in GB/s")
    print(f"{'size':>9} {'ddp us':>9} {'ddp busbw':>10} {'mpi busbw':>10} {'gloo busbw':>11} {'ddp/mpi':>8} {'ddp/gloo':>9}")
    ok = True
    for s in SIZES:
        d, m, g = med(ddp, s, 1), med(mpis, s, 1), med(gloo, s, 1)
        rm, rg = d / m if m == m else float("nan"), d / g if g == g else float("nan")
        label = f"{s // MiB} MiB" if s >= MiB else f"{s // KiB} KiB"
        print(f"{label:>9} {med(ddp, s, 0):9.1f} {d:10.3f} {m:10.3f} {g:11.3f} {rm:8.2f} {rg:9.2f}")
        # Sizes a peer does not measure (nan) cannot be compared.
        if 64 * KiB <= s <= 64 * MiB and m == m and not rm >= 1.0:
            ok = False
        if s >= 256 * KiB and g == g and not rg >= 3.0:
            ok = False
    lat = med(ddp, 4 * KiB, 0)
    print(f"4 KiB all-reduce latency: ddp {lat:.1f} us, mpi {med(mpis, 4 * KiB, 0):.1f} us, "
          f"gloo {med(gloo, 4 * KiB, 0):.1f} us")
    print(f"targets: busbw >= mpi at 64 KiB..64 MiB and >= 3x gloo at >= 256 KiB: {'met' if ok else 'NOT met'}; "
          f"4 KiB <= 10 us: {'met' if lat <= 10 else 'NOT met'}")


# ---- two hosts ----------------------------------------------------------------

def both_nodes(hosts, argv_for):
    # Gloo picks its interface from the hostname, which does not resolve inside a
    # namespace: point it at the namespace's link.
    env = dict(ENV, GLOO_SOCKET_IFNAME="eth0")
    procs = [subprocess.Popen(hosts.on(i, argv_for(i)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in (1, 0)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate() for p in procs]
        sys.exit("a node did not finish in 300 s:\n" + "\n".join(o + e for o, e in outs))
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            sys.exit(f"a node failed ({p.returncode}):\n{o}\n{e}")
    return outs[1][0]  # node 0 prints rank 0's lines


def two_hosts(runs):
    with Hosts(2) as hosts:
        master = hosts.address(0)
        ddp, gloo = [], []
        for _ in interleaved(runs, progress=True):
            ddp.append(parse_ddp(both_nodes(hosts, lambda n: [
                paths.DDPRUN, "--nnodes=2", f"--node_rank={n}", f"--master_addr={master}", "--master_port=29511",
                "--nproc_per_node=1", paths.DDP_BENCH, "-b", "16M", "-e", "64M", "-f", "4"])))
            gloo.append(parse_peer(both_nodes(hosts, lambda n: [
                paths.PY, paths.TORCHRUN_PY, "--nnodes=2", f"--node_rank={n}",
                f"--master_addr={master}", "--master_port=29512", "--nproc_per_node=1", "--monitor_interval", "0.1",
                os.path.join(paths.PEERS, "gloo_allreduce.py")])))
    print(f"2 hosts (network namespaces over veth), 1 rank each; medians of {runs} interleaved runs; busbw GB/s")
    for s in (16 * MiB, 64 * MiB):
        d, g = med(ddp, s, 1), med(gloo, s, 1)
        print(f"{s // MiB:>4} MiB  ddp {d:7.3f}  gloo {g:7.3f}  ratio {d / g:5.2f}")
    d, g = med(ddp, 64 * MiB, 1), med(gloo, 64 * MiB, 1)
    print(f"target: 64 MiB busbw >= gloo's: {'met' if d >= g else 'NOT met'}")


# ---- dead peer ------------------------------------------------------------------

def dead_peer(runs, world=4, victim=2):
    """Rank `victim` of `world` plain processes SIGKILLs itself while the others wait
    in an all_reduce; seconds until each survivor's call failed naming it."""
    worker = paths.COLLECTIVE_WORKER
    delays = []
    for i in range(runs):
        port = 29700 + i
        procs = []
        for r in range(world):
            env = dict(ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world))
            for k in ("DDPRUN_STORE_ADDR", "TORCHELASTIC_RUN_ID"):
                env.pop(k, None)
            procs.append(subprocess.Popen([worker, "die", str(victim)], stdout=subprocess.PIPE, text=True, env=env))
        outs = [p.communicate(timeout=60)[0] for p in procs]
        died = float(re.search(r"dying at ([\d.]+)", outs[victim])[1])
        for r, out in enumerate(outs):
            if r == victim:
                continue
            m = re.search(rf"PeerError rank={victim} at ([\d.]+)", out)
            if not m:
                sys.exit(f"rank {r} did not name rank {victim}:\n{out}")
            delays.append(float(m[1]) - died)
    f = figures(delays)
    print(f"dead peer ({world} ranks on one host, {runs} runs, {f.runs} detections): "
          f"median {f.median * 1e3:.1f} ms, max {f.max * 1e3:.1f} ms; "
          f"target <= 2 s: {'met' if f.max <= 2 else 'NOT met'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--two-hosts", action="store_true")
    ap.add_argument("--dead-peer", action="store_true", help="only the dead-peer detection time")
    a = ap.parse_args()
    who = "collectives bench"
    paths.require(who, paths.DDPRUN, paths.DDP_BENCH)
    if a.dead_peer:
        paths.require(who, paths.COLLECTIVE_WORKER)
        dead_peer(a.runs)
        return
    paths.require_peers(who, paths.TORCHRUN_PY, os.path.join(paths.PEERS, "gloo_allreduce.py"))
    if a.two_hosts:
        paths.require_root(who)
        two_hosts(a.runs)
    else:
        paths.require_peers(who, os.path.join(paths.PEERS, "mpi_allreduce.c"))
        one_host(a.runs)


if __name__ == "__main__":
    main()
