// Worker output: every worker's stdout and stderr come through pipes to ddprun,
// which writes them to the console one whole line at a time, each line prefixed
// with "[rankN]:" or --log_line_prefix_template's prefix (line_prefix.hpp), and (with a
// log dir) to per-rank log files byte for byte. Lines holding one of the
// --duplicate_*_filters strings also go, prefixed, to the attempt's filtered log.
// ddprun is the only writer of its stdout/stderr and writes whole lines per
// write(), so lines of different ranks never mix mid-line. When a log file cannot
// be written (disk full, I/O error), ddprun says so once and the stream goes to
// the console from then on: no output is lost.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "job/attempt_result.hpp"
#include "supervise/line_splitter.hpp"

namespace ddprun {

class Console;

// The last few lines of a stream, kept for the failure summary.
class TailBuffer {
 public:
  static constexpr size_t kLines = 10;
  static constexpr size_t kLineChars = 300;

  void push(std::string_view line);
  const std::deque<std::string>& lines() const { return lines_; }

 private:
  std::deque<std::string> lines_;
};

// The file every worker stream of an attempt duplicates its filtered lines to
// (<attempt dir>/filtered_stdout.log or filtered_stderr.log, as torchrun names them).
// Each line goes out in one write() to a file opened for appending, so lines of
// different ranks never mix. A failed write is reported once and the file dropped.
class FilteredLog {
 public:
  // Throws LaunchError naming the file when it cannot be created.
  explicit FilteredLog(std::string path);
  ~FilteredLog();
  FilteredLog(const FilteredLog&) = delete;
  FilteredLog& operator=(const FilteredLog&) = delete;

  void write_line(const std::string& prefixed_line);

 private:
  std::string path_;
  int fd_ = -1;
};

// One worker stream (stdout or stderr): console copy with prefix, optional log file,
// and (for stderr) the tail for the summary.
//
// When the log file cannot be written, the stream reports it once (an error on
// ddprun's log), records it (log_failure()) and, if it was kept off the console,
// goes to `fallback` from the line the failed write was in: every line is whole in
// the log or on the console (the log may end in a piece of that line).
class WorkerStream {
 public:
  struct Options {
    std::string prefix;          // e.g. "[rank3]:"
    bool skip_present_prefix = true;  // a line already starting with `prefix` gets no second one
    std::shared_ptr<FilteredLog> duplicate;  // lines holding one of `filters` also go here
    std::vector<std::string> filters;
    Console* console = nullptr;  // Console::out() or err(); nullptr keeps it off the console
    int log_fd = -1;             // an open log file, owned by this object; -1 for none
    bool keep_tail = false;
    std::string log_path;        // the log file's name, for messages
    std::string label;           // e.g. "rank 3's stdout", for messages
    Console* fallback = nullptr;  // the console this stream goes to once its log fails
  };

  explicit WorkerStream(Options options);
  ~WorkerStream();
  WorkerStream(const WorkerStream&) = delete;
  WorkerStream& operator=(const WorkerStream&) = delete;

  void consume(std::string_view data);
  // End of stream: flushes a last line that had no '\n' and closes the log file.
  void finish();

  const TailBuffer& tail() const { return tail_; }
  // Set once writing the log failed: the log file lacks part of the stream.
  const std::optional<LogFailure>& log_failure() const { return log_failure_; }

 private:
  void split(std::string_view data);
  void log_failed(int error, bool stream_ended);
  void take_line(std::string_view line);
  void flush_batch();

  Options options_;
  LineSplitter splitter_;
  TailBuffer tail_;
  std::string batch_;  // prefixed lines waiting for one write()
  bool finished_ = false;
  std::optional<LogFailure> log_failure_;
};

}  // namespace ddprun
