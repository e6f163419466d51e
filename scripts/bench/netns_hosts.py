"""Two test hosts for the benchmarks: network namespaces <prefix>-n0 and -n1 on a
bridge in <prefix>-sw, addressed <subnet>.1 and <subnet>.2 (needs root)."""
import subprocess


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


def make_hosts(prefix, subnet, count=2):
    ip("netns", "add", prefix + "-sw")
    ip("-n", prefix + "-sw", "link", "add", "br0", "type", "bridge")
    ip("-n", prefix + "-sw", "link", "set", "br0", "up")
    for i in range(count):
        ns, a, b = f"{prefix}-n{i}", f"{prefix}a{i}", f"{prefix}b{i}"
        ip("netns", "add", ns)
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        ip("link", "set", a, "netns", ns)
        ip("link", "set", b, "netns", prefix + "-sw")
        ip("-n", ns, "link", "set", a, "name", "eth0")
        ip("-n", ns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", prefix + "-sw", "link", "set", b, "master", "br0")
        ip("-n", prefix + "-sw", "link", "set", b, "up")


def remove_hosts(prefix, count=2):
    for ns in [f"{prefix}-n{i}" for i in range(count)] + [prefix + "-sw"]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
