#include "supervise/output.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>

#include "errors.hpp"
#include "supervise/console.hpp"
#include "supervise/write_fully.hpp"

namespace ddprun {

void TailBuffer::push(std::string_view line) {
  if (lines_.size() == kLines) lines_.pop_front();
  lines_.emplace_back(line.substr(0, kLineChars));
}

FilteredLog::FilteredLog(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw LaunchError("cannot open log file '" + path_ + "': " + strerror(errno));
}

FilteredLog::~FilteredLog() {
  if (fd_ >= 0) ::close(fd_);
}

void FilteredLog::write_line(const std::string& prefixed_line) {
  if (fd_ < 0) return;
  if (write_fully(fd_, prefixed_line) < prefixed_line.size()) {
    spdlog::error("cannot write log file '{}': {}; filtered lines are no longer written to it", path_,
                  strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }
}

WorkerStream::WorkerStream(Options options) : options_(std::move(options)) {}

WorkerStream::~WorkerStream() {
  if (options_.log_fd >= 0) ::close(options_.log_fd);
}

void WorkerStream::consume(std::string_view data) {
  if (options_.log_fd >= 0) {
    size_t written = write_fully(options_.log_fd, data);
    if (written < data.size()) {
      int error = errno;
      // The lines the log holds whole stay where they are; the line the failed write
      // was in goes to the console whole, with everything after it.
      size_t last_newline = data.substr(0, written).rfind('\n');
      size_t whole = last_newline == std::string_view::npos ? 0 : last_newline + 1;
      split(data.substr(0, whole));
      data.remove_prefix(whole);
      log_failed(error, false);
    }
  }
  split(data);
}

void WorkerStream::finish() {
  if (finished_) return;
  finished_ = true;
  splitter_.finish([this](std::string_view line) { take_line(line); });
  flush_batch();
  if (options_.log_fd >= 0 && ::close(options_.log_fd) != 0 && errno != EINTR) {
    int error = errno;  // e.g. EIO or EDQUOT from a network file system: data written earlier is lost
    options_.log_fd = -1;
    log_failed(error, true);
  }
  options_.log_fd = -1;
}

void WorkerStream::split(std::string_view data) {
  // A log-only stream is split too: the line in progress must be at hand if the log fails.
  if (options_.console == nullptr && !options_.keep_tail && options_.log_fd < 0 && !options_.duplicate) return;
  splitter_.feed(data, [this](std::string_view line) { take_line(line); });
  flush_batch();
}

void WorkerStream::log_failed(int error, bool stream_ended) {
  if (options_.log_fd >= 0) ::close(options_.log_fd);
  options_.log_fd = -1;
  log_failure_ = LogFailure{options_.log_path, strerror(error)};
  std::string what;
  if (stream_ended) {
    what = "the log may be incomplete";
  } else if (options_.console != nullptr) {
    what = "the log is incomplete; " + options_.label + " is on the console";
  } else {
    options_.console = options_.fallback;
    what = "the log is incomplete; " + options_.label + " goes to the console from here on";
  }
  spdlog::error("cannot write log file '{}': {}; {}", log_failure_->path, log_failure_->error, what);
}

void WorkerStream::take_line(std::string_view line) {
  if (options_.keep_tail) tail_.push(line);
  // PyTorch 2.x prefixes some lines itself ("[rank0]: Traceback ..."): one prefix is enough.
  const bool prefixed = !(options_.skip_present_prefix && line.starts_with(options_.prefix));
  if (options_.duplicate) {
    for (const auto& needle : options_.filters) {
      if (line.find(needle) == std::string_view::npos) continue;
      options_.duplicate->write_line((prefixed ? options_.prefix : std::string()) + std::string(line) + "\n");
      break;
    }
  }
  if (options_.console == nullptr) return;
  if (prefixed) batch_.append(options_.prefix);
  batch_.append(line).push_back('\n');
}

void WorkerStream::flush_batch() {
  if (!batch_.empty() && options_.console != nullptr) options_.console->write(std::move(batch_));
  batch_.clear();
}

}  // namespace ddprun
