"""The benchmark behind scripts/bench/torch_store (see there).

Servers of PyTorch's TCPStore protocol, each started fresh for every measurement and
interleaved within each run (the order reverses every other run):
  ddprun        ddp-rendezvous --torch-clients JOB (torch clients admitted into one job)
  torch-libuv   PyTorch 2.15's TCPStore server, libuv backend (torch's default), hosted
                by a python process (`TCPStore(host, 0, is_master=True,
                wait_for_workers=False, use_libuv=True)`, kept alive)
  torch-legacy  the same with use_libuv=False (2.15 still has the old poll() backend)
The clients are ddp-torch-store-load (scripts/bench/torch_store_load.cpp), which writes
the bytes torch 2.x's client writes:
  (a) the init barrier: N clients each connect, VALIDATE, PING, ADD "init/" 1 (what
      TCPStore(world_size=N) does on a worker), then torch's _store_based_barrier (what
      init_process_group runs with TORCH_DIST_INIT_BARRIER=1): ADD K 1, ADD K 0, the last
      one SETs K:last_worker, WAIT on it. The time from the first connect to the last
      client released.
  (b) 64 clients looping store.set(k, v) (no reply) or store.get(k) (WAIT then GET);
      calls per second, the clock stopped once every call reached the server.
  (c) the server's peak RSS (VmHWM) during the 16,384-client barrier, and its growth
      over the RSS it had before the clients came (torch's server lives in a python
      process that imported torch: most of its RSS is that).

Run as root it moves itself into a network namespace of its own with only loopback up:
torch's server asks for the name of every client it accepts (reverse DNS), and where
the machine's resolver stalls (here: about 5 s after ~50 quick lookups) that would
measure the resolver. With no route out, every lookup fails at once, for every server
alike. --host-network keeps the machine's namespace.
"""
import argparse
import os
import re
import resource
import subprocess
import sys

from harness import paths
from harness.procs import Daemon, status_kib
from harness.runs import Samples, interleaved

JOB = "torchbench"
TOKEN = "bench-token"
CLIENTS = (1024, 4096, 16384)
OPS_CLIENTS = 64
NETNS_MARK = "DDPRUN_TORCH_STORE_BENCH_NETNS"

# Hosts torch's TCPStore server on an ephemeral port until stdin closes.
TORCH_HOST = """
import sys
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=sys.argv[1] == "libuv")
print("listening on", store.port, flush=True)
sys.stdin.read()
"""


class TorchServer:
    """torch 2.15's TCPStore server in a python process of its own (`backend`: libuv or
    legacy); `port`, `pid`; a context manager that stops it."""

    def __init__(self, backend):
        self.proc = subprocess.Popen([paths.TORCH2, "python", "-c", TORCH_HOST, backend], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"listening on (\d+)", line)
        if not m:
            self.stop()
            sys.exit(f"torch_store bench: torch's {backend} server did not start: {line!r}")
        self.port = int(m[1])

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start(server):
    if server == "ddprun":
        return Daemon(["--host", "127.0.0.1", "--port", "0", "--max-connections", "100000", "--torch-clients", JOB],
                      dict(os.environ, DDPRUN_TOKEN=TOKEN))
    return TorchServer(server.removeprefix("torch-"))


def cpu_seconds(pid):
    """utime + stime of a live process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def barrier(server, n, timeout):
    """One fresh server, n clients through torch's init barrier. Returns (seconds, peak
    KiB, growth KiB), or a string saying how far it got."""
    with start(server) as s:
        before = status_kib(s.pid)
        load = subprocess.Popen([paths.TORCH_STORE_LOAD, "barrier", "127.0.0.1", str(s.port), str(n), "--timeout",
                                 str(timeout)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        first = load.stdout.readline()
        m = re.search(r"released after ([0-9.]+) s", first)
        if not m:
            load.wait(timeout=30)
            return (first + load.stderr.read()).strip() or f"load generator exited {load.returncode}"
        if load.stdout.readline().strip() != "idle":
            sys.exit("torch_store bench: the load generator did not go idle")
        peak = status_kib(s.pid, "VmHWM")
        load.stdin.close()
        load.wait(timeout=60)
        return float(m[1]), peak, peak - before


def ops(server, op, seconds):
    """One fresh server, 64 clients calling `op` for `seconds`. Returns (calls/s, server CPU
    share, load generator CPU share) or a string saying what failed."""
    with start(server) as s:
        cpu0 = cpu_seconds(s.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = subprocess.Popen([paths.TORCH_STORE_LOAD, "ops", "127.0.0.1", str(s.port), str(OPS_CLIENTS),
                                 str(seconds), op], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = load.communicate(timeout=seconds + 180)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        m = re.search(r"([0-9.]+) calls/s .* in ([0-9.]+) s", out)
        if load.returncode != 0 or not m:
            return (out + err).strip() or f"load generator exited {load.returncode}"
        took = float(m[2])
        load_cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
        return float(m[1]), (cpu_seconds(s.pid) - cpu0) / took, load_cpu / took


def progress(what, got):
    """One measurement on stderr as it is taken, so that an interrupted run leaves its figures."""
    print(f"  {what}: {got if isinstance(got, str) else ' '.join(f'{v:.3f}' for v in got)}", file=sys.stderr, flush=True)


def enter_private_network(argv):
    """Re-runs this script in a network namespace with only loopback up (root only)."""
    if os.environ.get(NETNS_MARK) or os.geteuid() != 0:
        return
    os.environ[NETNS_MARK] = "1"
    script = 'ip link set lo up && exec "$@"'
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", script, "sh", sys.executable, os.path.abspath(__file__),
                          *argv])


def fmt(figs):
    return f"{figs.median:.3f} [{figs.min:.3f}-{figs.max:.3f}]"


def verdict(ok):
    return "met" if ok else "NOT met"


def against_peers(samples, key, peers):
    """(peer, ddprun's median, the peer's median or None) for each peer; none when ddprun
    has no figure. `key(server)` names a server's samples."""
    if not samples[key("ddprun")]:
        return []
    return [(p, samples.median(key("ddprun")), samples.median(key(p)) if samples[key(p)] else None) for p in peers]


def report_barrier(servers, peers, args, times, failures):
    print(f"\n(a) torch's init barrier, seconds from the first connect to the last client released, "
          f"median [min-max] of {args.runs}")
    print(f"{'clients':>8} " + " ".join(f"{s:>26}" for s in servers))
    for n in args.clients:
        cells = [fmt(times.figures((s, n))) if times[(s, n)] else "failed" for s in servers]
        print(f"{n:>8} " + " ".join(f"{c:>26}" for c in cells))
        for s in servers:
            for why in failures.get((s, n), [])[:1]:
                print(f"{'':>8} {s} failed {len(failures[(s, n)])}x: {why}")
    top = max(args.clients)
    for p, ours, theirs in against_peers(times, lambda s: (s, top), peers):
        if theirs is None:
            print(f"target ddprun <= 1/3 of {p}'s time at {top:,}: {p} never finished: met")
        else:
            print(f"target ddprun <= 1/3 of {p}'s time at {top:,}: {ours:.3f} s vs {theirs:.3f} s, "
                  f"ratio {ours / theirs:.3f}: {verdict(ours * 3 <= theirs)}")


def report_ops(servers, peers, args, rates, failures):
    print(f"\n(b) {OPS_CLIENTS} clients, torch client calls per second, median [min-max] of {args.runs}; "
          "CPU shares (1.0 = one core) of the server and of the load generator")
    for op in ("set", "get"):
        for s in servers:
            if not rates[(s, op)]:
                print(f"{op.upper()} {s:>13}: failed: {failures.get((s, op), ['?'])[0]}")
                continue
            f = rates.figures((s, op))
            print(f"{op.upper()} {s:>13}: {f.median:>10,.0f} calls/s [{f.min:,.0f}-{f.max:,.0f}]   server CPU "
                  f"{rates.median((s, op, 'server')):.2f}, load generator CPU {rates.median((s, op, 'load')):.2f}")
        for p, ours, theirs in against_peers(rates, lambda s: (s, op), peers):
            if theirs:
                print(f"target {op.upper()} ddprun >= 3x {p}: ratio {ours / theirs:.2f}: {verdict(ours >= 3 * theirs)}")


def report_rss(servers, peers, args, rss):
    print(f"\n(c) server RSS during the {max(args.clients):,}-client barrier (MiB): peak (VmHWM), and growth over "
          "the RSS before the clients came")
    for s in servers:
        if rss[(s, "peak")]:
            print(f"{s:>13}: peak {rss.median((s, 'peak')) / 1024:8.1f}   growth "
                  f"{rss.median((s, 'growth')) / 1024:8.1f}")
    for p, ours, theirs in against_peers(rss, lambda s: (s, "peak"), peers):
        if theirs:
            grow = rss.median(("ddprun", "growth")) / max(1, rss.median((p, "growth")))
            print(f"target peak RSS ddprun <= 1/2 of {p}'s: ratio {ours / theirs:.3f}: {verdict(ours * 2 <= theirs)}"
                  f" (growth ratio {grow:.2f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)), help="barrier sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each set/get run")
    parser.add_argument("--servers", default="ddprun,torch-libuv,torch-legacy")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a barrier may take before it counts as failed")
    parser.add_argument("--host-network", action="store_true", help="stay in the machine's network namespace")
    parser.add_argument("--smoke", action="store_true",
                        help="a check, not a measurement: ddprun only, 1 run, 1,024 clients, 0.5 s set/get; "
                             "exits 1 when any step fails")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.clients, args.seconds, args.servers = 1, "1024", 0.5, "ddprun"
    args.clients = [int(c) for c in args.clients.split(",")]
    servers = args.servers.split(",")
    unknown = set(servers) - {"ddprun", "torch-libuv", "torch-legacy"}
    if unknown:
        sys.exit(f"torch_store bench: unknown servers {sorted(unknown)}")
    paths.require("torch_store bench", paths.TORCH_STORE_LOAD, *([paths.DAEMON] if "ddprun" in servers else []))
    if any(s != "ddprun" for s in servers):
        paths.require_peers("torch_store bench", paths.TORCH2)
    if not args.host_network and not args.smoke:
        enter_private_network(sys.argv[1:])
        if not os.environ.get(NETNS_MARK):
            print("note: not root, so in the machine's network namespace: torch's server resolves every "
                  "client's name and a slow resolver shows in its figures", file=sys.stderr)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the servers and the load generator

    times, rss, rates = Samples(), Samples(), Samples()
    failures = {}
    for _, order in interleaved(args.runs, servers, alternate=True, progress=True):
        for s in order:
            for n in args.clients:
                got = barrier(s, n, args.timeout)
                progress(f"barrier {s} {n}", got)
                if isinstance(got, str):
                    failures.setdefault((s, n), []).append(got)
                    continue
                times[(s, n)].append(got[0])
                if n == max(args.clients):
                    rss[(s, "peak")].append(got[1])
                    rss[(s, "growth")].append(got[2])
            for op in ("set", "get"):
                got = ops(s, op, args.seconds)
                progress(f"{op} {s}", got)
                if isinstance(got, str):
                    failures.setdefault((s, op), []).append(got)
                    continue
                for key, value in zip(((s, op), (s, op, "server"), (s, op, "load")), got):
                    rates[key].append(value)
    peers = [s for s in servers if s != "ddprun"]
    report_barrier(servers, peers, args, times, failures)
    report_ops(servers, peers, args, rates, failures)
    report_rss(servers, peers, args, rss)
    if args.smoke and failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
