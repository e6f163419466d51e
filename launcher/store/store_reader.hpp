// Where the launching ddprun (--hostfile/--hosts) reads how its job is doing: its own
// store, through a connection held for the whole job (the store drops a job's keys when
// its last connection goes, and the agents are gone by the time the launcher reads).
//
// The agents of a fixed job go through attempts 0, 1, ... together (one per restart);
// each node registers in an attempt (node/<r>) before its workers start, and the
// attempt's first failure is its `failure` key (a notice, or a lost node's will). The
// job ends in the newest attempt any node registered in, so that attempt's failure,
// and only that one, is the job's: an earlier attempt's failure was restarted past.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "job/failure_notice.hpp"

namespace rdzv {
class TcpStore;
}

namespace ddprun {

struct StoreReaderOptions {
  std::string host;
  uint16_t port = 0;
  std::string token;
  std::string ns;        // the job's namespace (its run id)
  int nnodes = 1;        // node ranks 0..nnodes-1 register
  int max_restarts = 0;  // attempts 0..max_restarts may exist
};

class StoreReader {
 public:
  StoreReader() = default;  // reads nothing (node 0 hosts the store)
  // Connects now (within 5 s). Throws LaunchError when it cannot.
  explicit StoreReader(const StoreReaderOptions& options);

  bool enabled() const { return store_ != nullptr; }

  // The newest attempt any node registered in; 0 before any did. Attempts only grow,
  // so each call scans only past the last one found.
  int latest_attempt();
  // The failure of latest_attempt(); nothing when it has none (the job may still
  // succeed, or restarted past an earlier failure), or when the store cannot be read.
  std::optional<FailureNotice> latest_failure();
  // Whether node `node_rank` registered in some attempt: its agent got as far as the
  // job. Reads the store each time (within 2 s); false when it cannot.
  bool joined(int node_rank);

 private:
  bool any_node_in(int attempt);

  std::shared_ptr<rdzv::TcpStore> store_;
  StoreReaderOptions options_;
  int latest_ = 0;
};

}  // namespace ddprun
