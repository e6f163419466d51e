#include "remote/line_relay.hpp"

namespace ddprun {

void LineRelay::feed(std::string_view bytes) {
  std::string out;
  splitter_.feed(bytes, [&](std::string_view line) {
    // A piece of an overlong line is never the hidden line (that one is short).
    if (!hidden_seen_ && !hidden_.empty() && line.size() < kMaxLine && line == hidden_) {
      hidden_seen_ = true;
      return;
    }
    last_line_.assign(line);
    out.append(line);
    out += '\n';
  });
  if (!out.empty()) sink_(std::move(out));
}

void LineRelay::finish() {
  splitter_.finish([&](std::string_view line) {
    last_line_.assign(line);
    sink_(std::string(line) + '\n');
  });
}

}  // namespace ddprun
