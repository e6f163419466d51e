// The runtime file `ddprun status` reads (runtime_file.hpp). Format: one
// "name=value" per line; "worker=<rank> <pid>" once per local worker.
#include "diagnose/runtime_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"

namespace ddprun {

std::string RuntimeInfo::encode() const {
  std::ostringstream os;
  os << "run_id=" << run_id << "\npid=" << pid << "\nhostname=" << hostname << "\nnode_rank=" << node_rank
     << "\nnnodes=" << nnodes << "\nstore_addr=" << store.addr << "\nstore_port=" << store.port
     << "\nstore_token=" << store.token << "\nstore_ns=" << store.ns << "\nattempt=" << attempt
     << "\nworld_size=" << world_size << "\n";
  for (const WorkerProcess& w : workers) os << "worker=" << w.rank << " " << w.pid << "\n";
  return os.str();
}

std::optional<RuntimeInfo> RuntimeInfo::decode(const std::string& text) {
  RuntimeInfo info;
  std::istringstream in(text);
  std::string line;
  bool have_port = false, have_pid = false;
  auto number = [](const std::string& v, int& out) {
    auto n = ddp::contract::parse_integer(v);
    if (!n || *n < 0 || *n > 1'000'000'000) return false;
    out = static_cast<int>(*n);
    return true;
  };
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    int n = 0;
    if (name == "run_id") info.run_id = value;
    else if (name == "hostname") info.hostname = value;
    else if (name == "store_addr") info.store.addr = value;
    else if (name == "store_token") info.store.token = value;
    else if (name == "store_ns") info.store.ns = value;
    else if (name == "pid" && number(value, n)) info.pid = n, have_pid = true;
    else if (name == "node_rank" && number(value, n)) info.node_rank = n;
    else if (name == "nnodes" && number(value, n)) info.nnodes = n;
    else if (name == "store_port" && number(value, n)) info.store.port = n, have_port = true;
    else if (name == "attempt" && number(value, n)) info.attempt = n;
    else if (name == "world_size" && number(value, n)) info.world_size = n;
    else if (name == "worker") {
      std::istringstream w(value);
      WorkerProcess p;
      if (w >> p.rank >> p.pid) info.workers.push_back(p);
    }
  }
  // A damaged file must not make status allocate for a billion ranks.
  if (!have_pid || !have_port || info.store.addr.empty() || info.world_size <= 0 || info.world_size > kMostRanks) {
    return std::nullopt;
  }
  return info;
}

std::filesystem::path runtime_dir(bool create) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  std::filesystem::path dir;
  struct stat st {};
  if (xdg && *xdg && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid()) {
    dir = std::filesystem::path(xdg) / "ddprun";
  } else {
    dir = "/tmp/ddprun-" + std::to_string(getuid());
  }
  if (create && mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw LaunchError("cannot create " + dir.string() + ": " + std::strerror(errno));
  }
  if (lstat(dir.c_str(), &st) != 0) {
    if (!create && errno == ENOENT) return dir;
    throw LaunchError("cannot use " + dir.string() + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
    throw LaunchError(dir.string() + " is not a folder of this user closed to others (mode 0700); remove it");
  }
  return dir;
}

std::vector<FoundRuntimeFile> find_runtime_files() {
  std::vector<FoundRuntimeFile> out;
  std::filesystem::path dir = runtime_dir(false);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       ++it) {
    if (!it->is_regular_file() || it->path().filename().string().find(".tmp") != std::string::npos) continue;
    FoundRuntimeFile f;
    f.path = it->path();
    std::ifstream in(f.path);
    std::stringstream text;
    text << in.rdbuf();
    f.info = RuntimeInfo::decode(text.str());
    f.alive = f.info && (kill(f.info->pid, 0) == 0 || errno == EPERM);
    out.push_back(std::move(f));
  }
  return out;
}

RuntimeFile::~RuntimeFile() {
  if (path_) unlink(path_->c_str());
}

void RuntimeFile::started(int attempt, const JobLayout& layout, const std::vector<WorkerOutcome>& workers,
                          std::function<void(const JobStop&)>) {
  info_.attempt = attempt;
  info_.node_rank = layout.node_rank;  // an elastic node's rank and count change between attempts
  info_.nnodes = layout.nnodes;
  info_.world_size = layout.world_size;
  info_.store = layout.store;
  info_.workers.clear();
  for (const WorkerOutcome& w : workers) info_.workers.push_back({w.rank, w.pid});
  try {
    if (!path_) path_ = runtime_dir(true) / (info_.run_id + "." + std::to_string(info_.pid));
    // Written aside and renamed, so a reader never sees half a file.
    std::string tmp = path_->string() + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw LaunchError("cannot write " + tmp + ": " + std::strerror(errno));
    std::string text = info_.encode();
    bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    close(fd);
    if (!ok || rename(tmp.c_str(), path_->c_str()) != 0) {
      unlink(tmp.c_str());
      throw LaunchError("cannot write " + path_->string() + ": " + std::strerror(errno));
    }
  } catch (const LaunchError& e) {
    spdlog::warn("`ddprun status` will not find this job: {}", e.what());
    path_.reset();
  }
}

}  // namespace ddprun
