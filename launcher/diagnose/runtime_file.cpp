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
#include <limits>
#include <sstream>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"
#include "rdzv/token.hpp"

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

namespace {

// The run id, pid and temp flag of a runtime file's name; nothing for any other name.
std::optional<FoundRuntimeFile> runtime_file_name(const std::string& name) {
  FoundRuntimeFile f;
  std::string rest = name;
  if (rest.size() > 4 && rest.compare(rest.size() - 4, 4, ".tmp") == 0) {
    f.temp = true;
    rest.resize(rest.size() - 4);
  }
  const auto dot = rest.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  f.run_id = rest.substr(0, dot);
  const auto pid = ddp::contract::parse_integer(rest.substr(dot + 1));
  if (!pid || *pid <= 0 || *pid > std::numeric_limits<pid_t>::max() || rdzv::job_id_error("", f.run_id)) {
    return std::nullopt;
  }
  f.pid = static_cast<pid_t>(*pid);
  return f;
}

// A plain file's bytes, or why they were not read: not a plain file (a link, a FIFO),
// unreadable, or larger than kMaxRuntimeFile.
std::optional<std::string> read_bounded(const std::filesystem::path& path, std::string& problem) {
  // O_NONBLOCK: a FIFO of that name must not hold status up; O_NOFOLLOW: nor a link lead elsewhere.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    problem = std::string("cannot be opened: ") + std::strerror(errno);
    return std::nullopt;
  }
  std::string text;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    problem = "is not a plain file";
  } else if (static_cast<uint64_t>(st.st_size) > kMaxRuntimeFile) {
    problem = "has " + std::to_string(st.st_size) + " bytes, more than a runtime file has (at most " +
              std::to_string(kMaxRuntimeFile) + ")";
  } else {
    text.resize(kMaxRuntimeFile + 1);  // a file that grows meanwhile is still cut off
    size_t have = 0;
    for (;;) {
      const ssize_t n = read(fd, text.data() + have, text.size() - have);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) problem = std::string("cannot be read: ") + std::strerror(errno);
      if (n <= 0 || (have += static_cast<size_t>(n)) == text.size()) break;
    }
    if (have > kMaxRuntimeFile) problem = "grew past " + std::to_string(kMaxRuntimeFile) + " bytes while read";
    text.resize(have);
  }
  close(fd);
  if (!problem.empty()) return std::nullopt;
  return text;
}

}  // namespace

std::vector<FoundRuntimeFile> find_runtime_files() {
  std::vector<FoundRuntimeFile> out;
  std::filesystem::path dir = runtime_dir(false);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::optional<FoundRuntimeFile> f = runtime_file_name(it->path().filename().string());
    if (!f) continue;  // not ours: not read, not touched
    f->path = it->path();
    if (auto text = read_bounded(f->path, f->problem)) {
      f->info = RuntimeInfo::decode(*text);
      if (!f->info) {
        f->problem = "cannot be read as a runtime file";
      } else if (f->info->pid != f->pid || f->info->run_id != f->run_id) {
        f->problem = "names job " + f->info->run_id + " and pid " + std::to_string(f->info->pid) +
                     ", not those of its file name";
        f->info.reset();
      }
    }
    f->alive = kill(f->pid, 0) == 0 || errno == EPERM;
    out.push_back(std::move(*f));
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
