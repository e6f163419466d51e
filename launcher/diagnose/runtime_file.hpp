// The per-user runtime file through which `ddprun status` finds a running local job:
// the job's store endpoint, namespace and token, the attempt, and this node's worker
// pids. It lives in $XDG_RUNTIME_DIR/ddprun (else /tmp/ddprun-<uid>; folder 0700,
// file 0600, since it holds the token), is named <run_id>.<ddprun pid>, is rewritten
// when an attempt starts and is removed when ddprun exits on any path it controls.
// A file whose ddprun is gone (killed) is stale: status says so and removes it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "diagnose/stall_report.hpp"
#include "job/attempt_watch.hpp"

namespace ddprun {

// The most ranks a job may have as ddprun status reads it (registrations, runtime files).
constexpr int kMostRanks = 1 << 20;

struct RuntimeInfo {
  std::string run_id;
  pid_t pid = 0;               // ddprun's
  std::string hostname;
  int node_rank = 0;           // this node's rank in the attempt (GROUP_RANK)
  int nnodes = 1;              // the attempt's nodes (an elastic job's change)
  contract::StoreEndpoint store;  // the job's store (prefix unused)
  int attempt = 0;
  int world_size = 0;
  std::vector<WorkerProcess> workers;  // this node's, this attempt

  std::string encode() const;
  static std::optional<RuntimeInfo> decode(const std::string& text);
};

// The folder of runtime files; created 0700 when `create`. Throws LaunchError when it
// exists but is not a folder owned by this user with no access for others.
std::filesystem::path runtime_dir(bool create);

// A runtime file as found on disk.
struct FoundRuntimeFile {
  std::filesystem::path path;
  std::optional<RuntimeInfo> info;  // nothing: unreadable
  bool alive = false;               // its ddprun still runs
};
// Every runtime file of this user (none when the folder does not exist).
std::vector<FoundRuntimeFile> find_runtime_files();

// Writes the file when each attempt starts; removes it when destroyed.
class RuntimeFile : public AttemptWatch {
 public:
  explicit RuntimeFile(RuntimeInfo base) : info_(std::move(base)) {}
  ~RuntimeFile() override;
  RuntimeFile(const RuntimeFile&) = delete;
  RuntimeFile& operator=(const RuntimeFile&) = delete;

  void started(int attempt, const JobLayout& layout, const std::vector<WorkerOutcome>& workers,
               std::function<void(const JobStop&)> stop_job) override;
  void ended(int) override {}

 private:
  RuntimeInfo info_;
  std::optional<std::filesystem::path> path_;
};

}  // namespace ddprun
