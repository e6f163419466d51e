// Splitting a byte stream into lines, with a bound on a line's length so a writer
// that never ends a line cannot exhaust memory: a line reaching the bound goes out
// as a piece of exactly that many bytes, and the rest of it follows as further lines.
// Worker output (output.hpp) and the agents' output relayed to a launching ddprun
// (remote/line_relay.hpp) both split this way.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ddprun {

class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 1 << 20;
  using LineFn = std::function<void(std::string_view line)>;  // without the '\n'

  explicit LineSplitter(size_t max_line = kMaxLine) : max_line_(max_line) {}

  // Calls `on_line` for every line `data` completes (a line of max_line bytes without
  // a '\n' counts as complete).
  void feed(std::string_view data, const LineFn& on_line);
  // Emits a final line that had no '\n' (at end of stream).
  void finish(const LineFn& on_line);

 private:
  void emit(std::string_view piece, const LineFn& on_line);

  size_t max_line_;
  std::string partial_;
};

}  // namespace ddprun
