// Turns a stream of bytes from one agent (its stdout or stderr, through ssh or a
// pipe) into whole lines for the launcher's console, so lines of different nodes
// never interleave mid-line. A line is held until its newline, up to kMaxLine bytes
// (then it goes out in pieces, each ended with a newline: supervise/line_splitter.hpp
// splits); a partial last line goes out at the end of the stream.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "supervise/line_splitter.hpp"

namespace ddprun {

class LineRelay {
 public:
  static constexpr size_t kMaxLine = 64u << 10;

  // `sink` gets one or more whole lines at a time, each ending in '\n'.
  explicit LineRelay(std::function<void(std::string)> sink) : sink_(std::move(sink)), splitter_(kMaxLine) {}

  void feed(std::string_view bytes);
  // The stream ended: whatever is held goes out, with a newline added.
  void finish();
  // The last line that went out, without its newline (e.g. ssh's error message).
  const std::string& last_line() const { return last_line_; }
  // The first whole line equal to `line` (without its newline) is not relayed;
  // hidden_seen() says whether it came.
  void hide_once(std::string line) { hidden_ = std::move(line); }
  bool hidden_seen() const { return hidden_seen_; }

 private:
  std::function<void(std::string)> sink_;
  LineSplitter splitter_;
  std::string last_line_;
  std::string hidden_;
  bool hidden_seen_ = false;
};

}  // namespace ddprun
