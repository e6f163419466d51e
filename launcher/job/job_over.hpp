// The job ended without this node: what an elastic join throws (membership.hpp).
#pragma once

#include <string>

namespace ddprun {

// Thrown by Membership::join when the job is over without this node: an elastic node
// that arrives after the job ended (or ends while it waits to be admitted).
struct JobOver {
  int status = 0;       // the status the job ended with; this ddprun exits with it
  std::string message;  // one line for the console
};

}  // namespace ddprun
