// STUB (replaced by the remote-launch work).
#include "remote_launch.hpp"

#include "errors.hpp"
#include "hosts.hpp"

namespace ddprun {

int run_remote_launch(const LaunchOptions& options) {
  resolve_hosts(options);
  throw LaunchError("--hostfile/--hosts launches are not implemented yet");
}

}  // namespace ddprun
