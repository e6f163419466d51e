// Splitting a byte stream into bounded lines (line_splitter.hpp).
#include "supervise/line_splitter.hpp"

namespace ddprun {

void LineSplitter::feed(std::string_view data, const LineFn& on_line) {
  while (!data.empty()) {
    const size_t room = max_line_ - partial_.size();  // > 0: partial_ never holds a whole line
    const size_t nl = data.substr(0, room).find('\n');
    if (nl != std::string_view::npos) {
      emit(data.substr(0, nl), on_line);
      data.remove_prefix(nl + 1);
    } else if (data.size() >= room) {
      emit(data.substr(0, room), on_line);  // the line reached the bound: out it goes, in a piece
      data.remove_prefix(room);
    } else {
      partial_.append(data);
      return;
    }
  }
}

void LineSplitter::finish(const LineFn& on_line) {
  if (!partial_.empty()) on_line(partial_);
  partial_.clear();
}

void LineSplitter::emit(std::string_view piece, const LineFn& on_line) {
  if (partial_.empty()) {
    on_line(piece);  // the common case: the whole line is in this read, no copy
    return;
  }
  partial_.append(piece);
  on_line(partial_);
  partial_.clear();
}

}  // namespace ddprun
