"""sshd hosts for the benchmarks: network namespaces from hosts.py, the first
`hosts` of them each running Debian's /usr/sbin/sshd on its own address, the last one
a "login node" with no sshd, where launchers run. Keys, known hosts and sshd configs
are made in a temporary folder; nothing in ~/.ssh or /etc/ssh is read or written (the
client runs with -F none). The same fixture as tests/support/ssh_hosts.hpp (needs root).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .hosts import Hosts, processes_in


class SshHosts:
    def __init__(self, hosts=3):
        self.hosts = hosts
        self.dir = tempfile.mkdtemp(prefix="ddprun-bench-ssh-")
        self.sshd = []
        self.net = Hosts(hosts + 1)
        try:
            self.net_inodes = [os.stat(f"/run/netns/{self.netns(i)}").st_ino for i in range(hosts + 1)]
            self._make_keys()
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
            for i in range(hosts):
                self._start_sshd(i)
            for i in range(hosts):
                self._wait_accepting(i)
        except BaseException:
            self.close()
            raise

    def netns(self, i):
        return self.net.ns(i)

    def address(self, i):
        return self.net.address(i)

    @property
    def login(self):
        return self.hosts

    def on(self, i, argv):
        return self.net.on(i, argv)

    def ssh_argv(self):
        return ["ssh", "-F", "none", "-i", os.path.join(self.dir, "client_key"),
                "-o", "UserKnownHostsFile=" + os.path.join(self.dir, "known_hosts"),
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes"]

    def ssh_command(self):
        return " ".join(self.ssh_argv())

    def _keygen(self, path):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)

    def _make_keys(self):
        self._keygen(os.path.join(self.dir, "client_key"))
        shutil.copy(os.path.join(self.dir, "client_key.pub"), os.path.join(self.dir, "authorized_keys"))
        with open(os.path.join(self.dir, "known_hosts"), "w") as known:
            for i in range(self.hosts):
                key = os.path.join(self.dir, f"host_key_{i}")
                self._keygen(key)
                kind, blob = open(key + ".pub").read().split()[:2]
                known.write(f"{self.address(i)} {kind} {blob}\n")

    def _start_sshd(self, i):
        conf = os.path.join(self.dir, f"sshd_config_{i}")
        with open(conf, "w") as c:
            c.write(f"ListenAddress {self.address(i)}\nPort 22\n"
                    f"HostKey {self.dir}/host_key_{i}\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                    "PidFile none\nPrintMotd no\nLogLevel ERROR\n")
        self.sshd.append(subprocess.Popen(self.on(i, ["/usr/sbin/sshd", "-D", "-e", "-f", conf]),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

    def _wait_accepting(self, i):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.sshd[i].poll() is not None:
                sys.exit(f"ssh hosts: sshd on {self.address(i)} exited: {self.sshd[i].stderr.read().decode()}")
            r = subprocess.run(self.on(self.login, self.ssh_argv() + ["-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                                                                     self.address(i), "true"]),
                               capture_output=True, timeout=10)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        sys.exit(f"ssh hosts: sshd on {self.address(i)} did not accept the key in 20 s: {r.stderr.decode()}")

    def job_processes(self):
        """Live processes on the hosts and the login node other than the sshd listeners."""
        listeners = {p.pid for p in self.sshd}
        return [p for inode in self.net_inodes for p in processes_in(inode) if p not in listeners]

    def kill_job_processes(self):
        for _ in range(100):
            left = self.job_processes()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            time.sleep(0.02)

    def close(self):
        for p in self.sshd:
            p.kill()
            p.wait()
        if hasattr(self, "net_inodes"):
            self.kill_job_processes()
        self.net.close()
        shutil.rmtree(self.dir, ignore_errors=True)
