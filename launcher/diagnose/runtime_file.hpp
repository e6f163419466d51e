// The per-user runtime file through which `ddprun status` finds a running local job:
// the job's store endpoint, namespace and token, the attempt, and this node's worker
// pids. It lives in $XDG_RUNTIME_DIR/ddprun (else /tmp/ddprun-<uid>; folder 0700,
// file 0600, since it holds the token), is named <run_id>.<ddprun pid>, is rewritten
// when an attempt starts (written as <run_id>.<ddprun pid>.tmp and renamed) and is
// removed when ddprun exits on any path it controls. A file whose ddprun is gone
// (killed) is stale: status says so and removes it. Other files in the folder are
// not status's: it reads only names of that pattern, at most kMaxRuntimeFile bytes,
// and removes only a file that decodes as a runtime file naming the pid of its name.
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

// The most bytes a runtime file may have (a real one has a few hundred).
constexpr size_t kMaxRuntimeFile = 1 << 20;

// A file of the runtime folder named as a runtime file is: "<run id>.<pid>", or
// "<run id>.<pid>.tmp" while being written.
struct FoundRuntimeFile {
  std::filesystem::path path;
  std::string run_id;               // from the name
  pid_t pid = 0;                    // from the name
  bool temp = false;                // a ".tmp" name
  std::optional<RuntimeInfo> info;  // nothing: not readable as the runtime file its name says
  std::string problem;              // why not, for a one-line note
  bool alive = false;               // its ddprun still runs
  // It decodes as the runtime file its name says and its ddprun is gone: safe to remove.
  bool stale() const { return info && !alive; }
};
// The files of this user's runtime folder with a runtime file's name (none when the
// folder does not exist); any other file is not looked at. Reads at most
// kMaxRuntimeFile bytes of each, never follows a link nor opens anything but a plain
// file, and changes nothing.
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
