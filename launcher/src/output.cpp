#include "output.hpp"

#include "console.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace ddprun {

void LineSplitter::feed(std::string_view data, const LineFn& on_line) {
  while (!data.empty()) {
    size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      // No end of line yet: keep the piece, cutting overlong lines at kMaxLine.
      while (partial_.size() + data.size() >= kMaxLine) {
        size_t take = kMaxLine - partial_.size();
        partial_.append(data.substr(0, take));
        on_line(partial_);
        partial_.clear();
        data.remove_prefix(take);
      }
      partial_.append(data);
      return;
    }
    if (partial_.empty()) {
      on_line(data.substr(0, nl));
    } else {
      partial_.append(data.substr(0, nl));
      on_line(partial_);
      partial_.clear();
    }
    data.remove_prefix(nl + 1);
  }
}

void LineSplitter::finish(const LineFn& on_line) {
  if (!partial_.empty()) on_line(partial_);
  partial_.clear();
}

void TailBuffer::push(std::string_view line) {
  if (lines_.size() == kLines) lines_.pop_front();
  lines_.emplace_back(line.substr(0, kLineChars));
}

bool write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a non-blocking console (set by whoever shares it): wait until it drains
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, -1);
        continue;
      }
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

WorkerStream::WorkerStream(Options options) : options_(std::move(options)) {}

WorkerStream::~WorkerStream() {
  if (options_.log_fd >= 0) ::close(options_.log_fd);
}

void WorkerStream::consume(std::string_view data) {
  if (options_.log_fd >= 0 && !write_fully(options_.log_fd, data)) {
    ::close(options_.log_fd);  // a full disk must not stop the job; the console still has it
    options_.log_fd = -1;
  }
  if (options_.console == nullptr && !options_.keep_tail) return;
  splitter_.feed(data, [this](std::string_view line) { take_line(line); });
  flush_batch();
}

void WorkerStream::finish() {
  if (finished_) return;
  finished_ = true;
  splitter_.finish([this](std::string_view line) { take_line(line); });
  flush_batch();
  if (options_.log_fd >= 0) ::close(options_.log_fd);
  options_.log_fd = -1;
}

void WorkerStream::take_line(std::string_view line) {
  if (options_.keep_tail) tail_.push(line);
  if (options_.console != nullptr) batch_.append(options_.prefix).append(line).push_back('\n');
}

void WorkerStream::flush_batch() {
  if (!batch_.empty() && options_.console != nullptr) options_.console->write(std::move(batch_));
  batch_.clear();
}

}  // namespace ddprun
