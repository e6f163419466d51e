// SshHosts (ssh_hosts.hpp): keys, sshd per namespace host, process accounting by
// network namespace, teardown.
#include "ssh_hosts.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace testing {

namespace {

const std::string kSshd = "/usr/sbin/sshd";

void must(const std::vector<std::string>& argv) {
  auto r = run(argv, {}, std::chrono::seconds(30));
  if (r.status != 0) FAIL("setting up the ssh hosts: " << Catch::rangeToString(argv) << " failed: " << r.err);
}

// A fresh ed25519 key pair without a passphrase at `path` (and path.pub).
void make_key(const std::string& path) {
  must({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddprun-test", "-f", path});
}

std::vector<std::string> split_blanks(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// Live (not zombie) processes whose network namespace is `ns`.
std::vector<pid_t> live_processes_in(ino_t ns) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const pid_t pid = std::stoi(name);
    if (SshHosts::net_namespace_of(pid) == ns && process_alive(pid)) out.push_back(pid);
  }
  return out;
}

}  // namespace

SshHosts::SshHosts(int hosts) : hosts_(hosts) {
  if (geteuid() != 0) FAIL("ssh host tests need root to run sshd in network namespaces (CI runs as root)");
  try {
    cluster_ = std::make_unique<NetnsCluster>(hosts + 1);
    for (int i = 0; i <= hosts; ++i) {
      struct stat st {};
      if (stat(("/run/netns/" + cluster_->netns(i)).c_str(), &st) != 0) FAIL("no /run/netns entry for host " << i);
      net_inodes_.push_back(st.st_ino);
    }
    make_keys();
    // sshd refuses to start without its privilege-separation directory.
    std::filesystem::create_directories("/run/sshd");
    std::filesystem::permissions("/run/sshd", std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                                  std::filesystem::perms::group_exec |
                                                  std::filesystem::perms::others_read |
                                                  std::filesystem::perms::others_exec);
    for (int i = 0; i < hosts; ++i) start_sshd(i);
    for (int i = 0; i < hosts; ++i) wait_accepting(i);
  } catch (...) {
    kill_everything();
    throw;
  }
}

SshHosts::~SshHosts() { kill_everything(); }

void SshHosts::make_keys() {
  make_key((dir() / "client_key").string());
  std::filesystem::copy_file(dir() / "client_key.pub", dir() / "authorized_keys");
  std::ofstream known(dir() / "known_hosts");
  for (int i = 0; i < hosts_; ++i) {
    const std::string key = (dir() / ("host_key_" + std::to_string(i))).string();
    make_key(key);
    // "ssh-ed25519 AAAA... comment" -> "ADDRESS ssh-ed25519 AAAA..."
    auto words = split_blanks(read_file(key + ".pub"));
    if (words.size() < 2) FAIL("ssh-keygen wrote an unexpected public key: " << read_file(key + ".pub"));
    known << address(i) << " " << words[0] << " " << words[1] << "\n";
  }
}

void SshHosts::start_sshd(int host) {
  const auto config = dir() / ("sshd_config_" + std::to_string(host));
  std::ofstream c(config);
  c << "ListenAddress " << address(host) << "\n"
    << "Port 22\n"
    << "HostKey " << (dir() / ("host_key_" + std::to_string(host))).string() << "\n"
    << "AuthorizedKeysFile " << (dir() / "authorized_keys").string() << "\n"
    << "PermitRootLogin prohibit-password\n"
    << "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    << "UsePAM no\n"
    // The keys live under /tmp (world-writable): sshd's ownership checks would refuse them.
    << "StrictModes no\n"
    << "PidFile none\nPrintMotd no\nLogLevel ERROR\n";
  c.close();
  // -D: stays this process (the fixture owns and kills it); -e: its log on stderr.
  sshd_.push_back(std::make_unique<Process>(on(host, {kSshd, "-D", "-e", "-f", config.string()})));
}

void SshHosts::wait_accepting(int host) {
  std::vector<std::string> probe = ssh_argv();
  probe.insert(probe.end(), {"-o", "BatchMode=yes", "-o", "ConnectTimeout=2", address(host), "true"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto status = sshd_.at(static_cast<size_t>(host))->wait(std::chrono::milliseconds(0))) {
      FAIL("sshd on host " << host << " exited with " << *status << ": " << sshd_[static_cast<size_t>(host)]->err());
    }
    auto r = run(on_login(probe), {}, std::chrono::seconds(10));
    if (r.status == 0) return;
    last = r.err;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  FAIL("sshd on host " << host << " (" << address(host) << ") did not accept the test key within 20 s; ssh said: "
                       << last << "\nsshd said: " << sshd_.at(static_cast<size_t>(host))->err());
}

std::vector<std::string> SshHosts::ssh_argv() const {
  // -F none: no ssh_config of this machine or of root applies.
  return {"ssh", "-F", "none", "-i", (dir() / "client_key").string(),
          "-o", "UserKnownHostsFile=" + (dir() / "known_hosts").string(),
          "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes"};
}

std::string SshHosts::ssh_command() const {
  std::string line;
  for (const auto& word : ssh_argv()) line += (line.empty() ? "" : " ") + word;
  return line;
}

std::string SshHosts::unreachable_address() const {
  const std::string a = address(0);
  return a.substr(0, a.rfind('.')) + ".200";
}

ino_t SshHosts::net_namespace_of(pid_t pid) {
  struct stat st {};
  if (stat(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), &st) != 0) return 0;
  return st.st_ino;
}

std::vector<pid_t> SshHosts::processes_on(int host) const {
  const pid_t listener = host < hosts_ ? sshd_.at(static_cast<size_t>(host))->pid() : -1;
  auto pids = live_processes_in(net_namespace(host));
  pids.erase(std::remove(pids.begin(), pids.end(), listener), pids.end());
  return pids;
}

std::vector<pid_t> SshHosts::job_processes() const {
  std::vector<pid_t> all;
  for (int i = 0; i <= hosts_; ++i) {
    auto p = processes_on(i);
    all.insert(all.end(), p.begin(), p.end());
  }
  return all;
}

std::optional<double> SshHosts::wait_no_job_processes(std::chrono::milliseconds limit) const {
  const auto start = std::chrono::steady_clock::now();
  while (!job_processes().empty()) {
    if (std::chrono::steady_clock::now() - start > limit) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // test-side polling of /proc
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string SshHosts::describe(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t pid : pids) {
    std::string args = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(args.begin(), args.end(), '\0', ' ');
    out += std::to_string(pid) + " " + command_name(pid) + " " + args + "\n";
  }
  return out;
}

void SshHosts::kill_everything() {
  if (cluster_) {
    // Everything in these namespaces is this fixture's or the test's: sshd, its
    // sessions, agents and workers a failed test left. Again until none is left
    // (a dying parent may have forked just before).
    for (int round = 0; round < 100; ++round) {
      std::vector<pid_t> left;
      for (ino_t ns : net_inodes_) {
        auto pids = live_processes_in(ns);
        left.insert(left.end(), pids.begin(), pids.end());
      }
      if (left.empty()) break;
      for (pid_t pid : left) kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  sshd_.clear();  // reaps the listeners
  cluster_.reset();
}

}  // namespace testing
