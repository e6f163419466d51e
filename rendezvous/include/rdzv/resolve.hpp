// Name resolution bounded by a deadline. getaddrinfo takes no timeout: one lost DNS
// reply blocks it for the resolver's own (5 s, times its attempts). So the lookup runs
// on a thread of its own and a caller waits for it only until its deadline; a lookup
// still running then is kept, and the next call for the same host waits on it instead
// of starting another (the store client's connect tries and the launcher's "is this
// host the endpoint" question share one).
#pragma once

#include <netdb.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace rdzv {

// getaddrinfo's shape (no service: the caller sets its port), so tests can stand in
// for a slow resolver.
using LookupFn = std::function<int(const std::string& host, addrinfo** found)>;

struct Resolved {
  std::shared_ptr<const addrinfo> addresses;  // the list (port 0); null when there is none (yet)
  std::string why;                            // when null: the resolver's error, or that it has not answered
};

// host's addresses for stream sockets, any family, waiting no longer than `deadline`
// (or a few milliseconds, for an answer from /etc/hosts). An address is answered at once.
Resolved resolve(const std::string& host, std::chrono::steady_clock::time_point deadline,
                 const LookupFn& lookup = {});

}  // namespace rdzv
