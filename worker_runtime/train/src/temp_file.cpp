#include "temp_file.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

namespace ddp::temp_file {
namespace {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

// The inode number of this process's pid namespace ("pid:[4026531836]"), 0 when unknown.
uint64_t pid_namespace() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  if (n <= 0) return 0;
  const std::string text(link, static_cast<size_t>(n));
  const auto open = text.find('[');
  if (open == std::string::npos) return 0;
  return std::strtoull(text.c_str() + open + 1, nullptr, 10);
}

struct ProcessStart {
  char state = '?';      // R, S, D, T, Z (zombie), X (dead), ...
  uint64_t ticks = 0;    // start time in clock ticks since boot
};

// A process's state and start time from /proc/<pid>/stat; nothing when it does not exist.
std::optional<ProcessStart> process_start(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return std::nullopt;
  const auto paren = text.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(paren + 1));
  ProcessStart p;
  fields >> p.state;
  std::string skip;
  for (int field = 4; field < 22 && fields >> skip; ++field) {
  }
  if (!(fields >> p.ticks)) return std::nullopt;
  return p;
}

// 8 hex digits of the 32-bit FNV-1a hash of `text`: the same in every process and build.
std::string short_hash(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  char out[9] = {};
  std::snprintf(out, sizeof out, "%08x", h);
  return out;
}

// This host and pid namespace as short_hash() of "<host name>/<pid namespace inode>".
const std::string& machine_id() {
  static const std::string id = short_hash(host_name() + "/" + std::to_string(pid_namespace()));
  return id;
}

// This process's "<machine id>.<pid>.<start time>" (the pid part asked each time: a
// forked child writes under its own).
std::string writer_id() {
  const pid_t pid = ::getpid();
  const auto me = process_start(pid);
  return machine_id() + "." + std::to_string(pid) + "." + std::to_string(me ? me->ticks : 0);
}

std::string base_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A decimal field of at most 20 digits, or nothing.
std::optional<uint64_t> number(const std::string& text) {
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::strtoull(text.c_str(), nullptr, 10);
}

// Whether the writer a temporary name's id ("<machine id>.<pid>.<start>") names is
// known to be gone; false for another machine id's file and for an unreadable name.
bool writer_gone(const std::string& id, const std::string& machine) {
  const auto d2 = id.rfind('.');
  if (d2 == std::string::npos || d2 == 0) return false;
  const auto d1 = id.rfind('.', d2 - 1);
  if (d1 == std::string::npos) return false;
  const auto pid = number(id.substr(d1 + 1, d2 - d1 - 1));
  const auto start = number(id.substr(d2 + 1));
  if (id.substr(0, d1) != machine || !pid || !start || *pid == 0 || *pid > INT_MAX) return false;
  const auto now = process_start(static_cast<long>(*pid));
  return !now || now->state == 'Z' || now->state == 'X' || now->ticks != *start;
}

}  // namespace

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_for(const std::string& target) { return target + ".tmp." + writer_id(); }

void remove_stale(const std::string& target) {
  // Without /proc no writer can be told alive: remove nothing.
  if (!process_start(::getpid())) return;
  const std::string dir = directory_of(target);
  const std::string prefix = base_of(target) + ".tmp.";
  const std::string& machine = machine_id();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    if (!writer_gone(name.substr(prefix.size()), machine)) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(path.c_str());
  }
  ::closedir(d);
}

}  // namespace ddp::temp_file
