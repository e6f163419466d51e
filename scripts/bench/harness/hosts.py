"""Test hosts for the benchmarks: network namespaces joined by veth pairs to a bridge
that lives in a namespace of its own, so the machine's own network is never touched
(needs root and iproute2).

One allocator hands out the subnets: 10.231.S.0/24, S in 0..249, is taken by creating
the bridge's namespace dbench<S>-sw (which fails when it exists, so two benchmarks never
share S). Host i is the namespace dbench<S>-n<i>, at 10.231.S.(i+1) on its eth0. The
tests' hosts (tests/support/netns.hpp) live on 10.213.x and 10.214.x in namespaces
ddpt<pid>-*, with veths dt<pid>*: neither the subnets nor the names meet these.
"""
import os
import signal
import subprocess
import sys
import time

NET = "10.231"  # the benchmarks' /16; the tests use 10.213 and 10.214
NAME = "dbench"  # the benchmarks' namespaces and veths; the tests' are ddpt* and dt*
SUBNETS = 250


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _allocate():
    """The first free S from this pid's; its bridge namespace is created, so S is ours."""
    start = os.getpid() % SUBNETS
    for k in range(SUBNETS):
        s = (start + k) % SUBNETS
        r = subprocess.run(["ip", "netns", "add", f"{NAME}{s}-sw"], capture_output=True, text=True)
        if r.returncode == 0:
            return s
        if "exists" not in r.stderr:
            sys.exit(f"bench hosts: ip netns add failed: {r.stderr.strip()} (root is needed)")
    sys.exit(f"bench hosts: all {SUBNETS} subnets are taken (`ip netns list | grep {NAME}`: "
             "namespaces left by killed benchmarks can be deleted)")


def processes_in(inode):
    """Live (not zombie) processes whose network namespace has this inode (os.stat of
    /run/netns/NAME): what runs on a host, whoever started it."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/net").st_ino != inode:
                continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
        except OSError:
            continue
        out.append(int(name))
    return out


class Hosts:
    """`count` hosts on one allocated subnet; a context manager that removes them."""

    def __init__(self, count=2):
        self.count = count
        self.index = _allocate()
        self.prefix = f"{NAME}{self.index}"
        self.subnet = f"{NET}.{self.index}"
        self.bridge = self.prefix + "-sw"
        try:
            ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge, "link", "set", "br0", "up")
            for i in range(count):
                self._add(i)
        except BaseException:
            self.close()
            raise

    def _add(self, i):
        ns, a, b = self.ns(i), f"{self.prefix}a{i}", f"{self.prefix}b{i}"
        ip("netns", "add", ns)
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        ip("link", "set", a, "netns", ns)
        ip("link", "set", b, "netns", self.bridge)
        ip("-n", ns, "link", "set", a, "name", "eth0")
        ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", self.bridge, "link", "set", b, "master", "br0")
        ip("-n", self.bridge, "link", "set", b, "up")

    def ns(self, i):
        """Host i's network namespace (/run/netns/<name>)."""
        return f"{self.prefix}-n{i}"

    def address(self, i):
        return f"{self.subnet}.{i + 1}"

    def on(self, i, argv):
        """argv that runs `argv` on host i."""
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def set_link(self, i, state):
        """Host i's eth0 "down" (cut off the network, nothing is told) or "up" again."""
        ip("-n", self.ns(i), "link", "set", "eth0", state)

    def pids(self, i):
        p = subprocess.run(["ip", "netns", "pids", self.ns(i)], capture_output=True, text=True)
        return [int(x) for x in p.stdout.split()]

    def kill_all(self, i):
        """SIGKILL every process on host i at once, as a host that dies; repeats while a fork
        in flight leaves a new one behind."""
        for _ in range(50):
            pids = self.pids(i)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"processes on {self.ns(i)} survive SIGKILL: {self.pids(i)}")

    def kill_every_host(self, procs):
        """SIGKILL every process on every host, then reap procs (the Popen objects that
        started them), killing one that still has not exited after 10 s."""
        for i in range(self.count):
            self.kill_all(i)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def close(self):
        for ns in [self.ns(i) for i in range(self.count)] + [self.bridge]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
