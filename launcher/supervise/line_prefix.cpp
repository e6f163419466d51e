// Worker line prefixes (line_prefix.hpp).
#include "supervise/line_prefix.hpp"

#include <cctype>

namespace ddprun {
namespace {

bool identifier_char(char c, bool first) {
  return c == '_' || std::isalpha(static_cast<unsigned char>(c)) || (!first && std::isdigit(static_cast<unsigned char>(c)));
}

std::optional<std::string> field(const std::string& name, const LinePrefixFields& f) {
  if (name == "rank") return std::to_string(f.rank);
  if (name == "local_rank") return std::to_string(f.local_rank);
  if (name == "role_name") return f.role_name;
  if (name == "hostname") return f.hostname;
  return std::nullopt;
}

}  // namespace

LinePrefix line_prefix(const std::optional<std::string>& tmpl, const LinePrefixFields& f) {
  if (!tmpl) return {"[rank" + std::to_string(f.rank) + "]:", true};
  const std::string& t = *tmpl;
  std::string out;
  size_t i = 0;
  while (i < t.size()) {
    if (t[i] != '$') {
      out += t[i++];
      continue;
    }
    if (i + 1 < t.size() && t[i + 1] == '$') {  // "$$" is a literal '$'
      out += '$';
      i += 2;
      continue;
    }
    bool braced = i + 1 < t.size() && t[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1);
    size_t end = start;
    while (end < t.size() && identifier_char(t[end], end == start)) ++end;
    bool closed = !braced || (end < t.size() && t[end] == '}');
    auto value = end > start && closed ? field(t.substr(start, end - start), f) : std::nullopt;
    if (!value) {  // left as written
      out += t[i++];
      continue;
    }
    out += *value;
    i = end + (braced ? 1 : 0);
  }
  return {out, false};
}

}  // namespace ddprun
