#include "remote/line_relay.hpp"

namespace ddprun {

void LineRelay::feed(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    size_t newline = bytes.find('\n');
    size_t room = kMaxLine - partial_.size();
    if (newline == std::string_view::npos && bytes.size() < room) {
      partial_.append(bytes);
      break;
    }
    // A whole line, or as much of an overlong one as the bound allows.
    size_t take = newline == std::string_view::npos || newline >= room ? room : newline + 1;
    partial_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (partial_.back() != '\n') {
      partial_ += '\n';
    } else if (!hidden_seen_ && !hidden_.empty() && partial_ == hidden_) {
      hidden_seen_ = true;
      partial_.clear();
      continue;
    }
    last_line_.assign(partial_, 0, partial_.size() - 1);
    out += partial_;
    partial_.clear();
  }
  if (!out.empty()) sink_(std::move(out));
}

void LineRelay::finish() {
  if (partial_.empty()) return;
  last_line_ = partial_;
  partial_ += '\n';
  sink_(std::move(partial_));
  partial_.clear();
}

}  // namespace ddprun
