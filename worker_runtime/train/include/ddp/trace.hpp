// A timeline of training in Chrome's trace-event JSON (opens in Perfetto or
// chrome://tracing): complete events ("ph":"X") with one process per rank and one
// thread per activity (compute, communication).
//
//   ddp::Trace trace(pg->rank());
//   { auto s = trace.scope("forward"); model.forward(x); }
//   trace.write(pg, "run.json");   // a collective: rank 0 writes every rank's events
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/process_group.hpp"

namespace ddp {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  enum Track : int { kCompute = 0, kCommunication = 1 };

  explicit Trace(int rank);

  // Records an event that ran from `begin` to `end` on a track.
  void add(const std::string& name, Clock::time_point begin, Clock::time_point end, Track track = kCompute);

  // Records from construction to destruction.
  class Scope {
   public:
    Scope(Trace* t, std::string name, Track track) : t_(t), name_(std::move(name)), track_(track), begin_(Clock::now()) {}
    ~Scope() {
      if (t_) t_->add(name_, begin_, Clock::now(), track_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Trace* t_;
    std::string name_;
    Track track_;
    Clock::time_point begin_;
  };
  // A scope on `trace`, or a no-op when trace is null.
  static Scope scope(Trace* trace, std::string name, Track track = kCompute) {
    return Scope(trace, std::move(name), track);
  }

  size_t size() const { return events_.size(); }
  // This rank's events as JSON objects, comma separated.
  std::string json_events() const;

  // Collective over pg: every rank's events go to rank 0, which writes one JSON
  // file (atomically: temp file + rename). Throws Error when the file cannot be written.
  void write(ProcessGroup& pg, const std::string& path) const;

 private:
  struct Event {
    std::string name;
    double ts_us;
    double dur_us;
    Track track;
  };
  int rank_;
  Clock::time_point origin_;  // steady time of construction...
  double wall_origin_us_ = 0; // ...and the wall clock then: ranks share a timeline
  std::vector<Event> events_;
};

}  // namespace ddp
