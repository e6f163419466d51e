#include "remote/agent_handoff.hpp"

#include <algorithm>
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"

namespace ddprun {
namespace {

constexpr const char* kMagic = "ddprun-handoff 1";
constexpr size_t kMaxHandoffBytes = 4u << 20;  // far beyond any environment; bounds a bad sender

// Backslash, newline and carriage return escaped, so one value is one line.
std::string escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    if (++i == text.size()) throw LaunchError("launcher handoff: a value ends in a lone backslash");
    char c = text[i];
    if (c == '\\') out += '\\';
    else if (c == 'n') out += '\n';
    else if (c == 'r') out += '\r';
    else throw LaunchError(std::string("launcher handoff: unknown escape \\") + c);
  }
  return out;
}

}  // namespace

bool valid_variable_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  });
}

std::string encode_handoff(const AgentHandoff& handoff) {
  std::string out = std::string(kMagic) + "\n";
  out += "token " + escape(handoff.token) + "\n";
  for (const auto& [name, value] : handoff.env) out += "env " + name + "=" + escape(value) + "\n";
  out += "end\n";
  return out;
}

AgentHandoff read_handoff(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  AgentHandoff handoff;
  std::string line;
  size_t total = 0;
  bool first = true;
  while (true) {
    // One byte at a time: nothing after "end" may be taken from the pipe.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw LaunchError("launcher handoff: none arrived on standard input in time");
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) throw LaunchError("launcher handoff: poll on standard input failed");
    if (ready <= 0) continue;
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) throw LaunchError("launcher handoff: standard input ended before the handoff was complete");
    if (++total > kMaxHandoffBytes) throw LaunchError("launcher handoff: larger than 4 MiB");
    if (c != '\n') {
      line += c;
      continue;
    }
    if (first) {
      if (line != kMagic) throw LaunchError("launcher handoff: standard input does not start with '" + std::string(kMagic) + "'");
      first = false;
    } else if (line == "end") {
      return handoff;
    } else if (line.rfind("token ", 0) == 0) {
      handoff.token = unescape(line.substr(6));
    } else if (line.rfind("env ", 0) == 0) {
      auto eq = line.find('=', 4);
      std::string name = line.substr(4, eq == std::string::npos ? std::string::npos : eq - 4);
      if (eq == std::string::npos || !valid_variable_name(name)) throw LaunchError("launcher handoff: bad env line");
      handoff.env.emplace_back(name, unescape(line.substr(eq + 1)));
    } else {
      throw LaunchError("launcher handoff: unexpected line");
    }
    line.clear();
  }
}

std::string stop_line(int signal) { return "stop " + std::to_string(signal) + "\n"; }

std::optional<int> parse_stop_line(const std::string& line) {
  if (line.rfind("stop ", 0) != 0) return std::nullopt;
  auto n = ddp::contract::parse_integer(line.substr(5));
  if (!n || *n < 1 || *n > 64) return std::nullopt;
  return static_cast<int>(*n);
}

}  // namespace ddprun
