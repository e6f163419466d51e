#include "temp_file.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

namespace ddp::temp_file {
namespace {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  std::string host = buf;
  for (char& c : host) {
    const bool kept = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
    if (!kept) c = '_';
  }
  return host;
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

// This process's "<host>.<pid namespace>.<pid>.<start time>" (the pid part asked each
// time: a forked child writes under its own).
std::string writer_id() {
  static const std::string host = host_name() + "." + std::to_string(pid_namespace());
  const pid_t pid = ::getpid();
  const auto me = process_start(pid);
  return host + "." + std::to_string(pid) + "." + std::to_string(me ? me->ticks : 0);
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

// Whether the writer a temporary name's id ("<host>.<ns>.<pid>.<start>") names is known
// to be gone; false for another host's or namespace's file and for an unreadable name.
bool writer_gone(const std::string& id, const std::string& host, uint64_t ns) {
  const auto d3 = id.rfind('.');
  if (d3 == std::string::npos || d3 == 0) return false;
  const auto d2 = id.rfind('.', d3 - 1);
  if (d2 == std::string::npos || d2 == 0) return false;
  const auto d1 = id.rfind('.', d2 - 1);
  if (d1 == std::string::npos) return false;
  const auto their_ns = number(id.substr(d1 + 1, d2 - d1 - 1));
  const auto pid = number(id.substr(d2 + 1, d3 - d2 - 1));
  const auto start = number(id.substr(d3 + 1));
  if (id.substr(0, d1) != host || !their_ns || *their_ns != ns || !pid || !start || *pid == 0 || *pid > INT_MAX) {
    return false;
  }
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
  const std::string host = host_name();
  const uint64_t ns = pid_namespace();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    if (!writer_gone(name.substr(prefix.size()), host, ns)) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(path.c_str());
  }
  ::closedir(d);
}

}  // namespace ddp::temp_file
