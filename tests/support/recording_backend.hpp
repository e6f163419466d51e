// A backend stand-in (comm/src/backend.hpp) for tests of what ProcessGroup does
// around its backend: it records the name of every call that reaches it and, unless
// told otherwise, completes each at once without a Work. Needs comm/src on the
// include path.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"

namespace testing {

class RecordingBackend final : public ddp::detail::Backend {
 public:
  using Calls = std::vector<std::string>;
  // Runs a call instead of doing nothing (a stand-in that moves data, or throws).
  using OnRun = std::function<ddp::Work(const ddp::detail::Op&, const Backend&)>;

  RecordingBackend(std::string kind, int rank, int size, ddp::detail::Reach reach, OnRun on_run = {})
      : Backend(rank, size, reach), kind_(std::move(kind)), on_run_(std::move(on_run)) {}

  // What reached this backend: "all_reduce", ..., "new_group", "allocate", "abort".
  // Shared, so a test keeps reading it once a ProcessGroup owns the backend.
  std::shared_ptr<Calls> calls = std::make_shared<Calls>();

  std::string kind() const override { return kind_; }
  void abort(const std::string&) override { calls->push_back("abort"); }
  ddp::Work run(const ddp::detail::Op& op) override {
    calls->push_back(ddp::detail::op_kind_name(op.kind));
    return on_run_ ? on_run_(op, *this) : ddp::Work{};
  }
  // A member gets a backend "<kind>-sub" at its place in `ranks`.
  std::unique_ptr<Backend> make_subgroup(const std::vector<int>& ranks) override {
    calls->push_back("new_group");
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == rank()) {
        return std::make_unique<RecordingBackend>(kind_ + "-sub", static_cast<int>(i), static_cast<int>(ranks.size()),
                                                  reach(), on_run_);
      }
    }
    return nullptr;
  }
  std::unique_ptr<ddp::GroupMemory> allocate_memory(size_t bytes) override {
    calls->push_back("allocate");
    return Backend::allocate_memory(bytes);
  }

 private:
  std::string kind_;
  OnRun on_run_;
};

// A recording backend and the calls it will see.
struct Recording {
  std::unique_ptr<RecordingBackend> backend;
  std::shared_ptr<RecordingBackend::Calls> calls;
};
inline Recording recording(std::string kind, int rank, int size, ddp::detail::Reach reach,
                           RecordingBackend::OnRun on_run = {}) {
  auto b = std::make_unique<RecordingBackend>(std::move(kind), rank, size, reach, std::move(on_run));
  auto calls = b->calls;
  return {std::move(b), std::move(calls)};
}

// A group over a recording backend; `calls` (when given) receives its log.
inline std::shared_ptr<ddp::ProcessGroup> recording_group(std::string kind, int rank, int size, ddp::detail::Reach reach,
                                                          std::shared_ptr<RecordingBackend::Calls>* calls = nullptr,
                                                          RecordingBackend::OnRun on_run = {}) {
  Recording r = recording(std::move(kind), rank, size, reach, std::move(on_run));
  if (calls) *calls = r.calls;
  return std::make_shared<ddp::ProcessGroup>(std::move(r.backend));
}

}  // namespace testing
