// Opening a store connection: TCP connect (retried until the deadline, since nodes
// start in any order), liveness options, then the handshake of PROTOCOL.md. What
// follows it, the pipelined link, is link.hpp.
#pragma once

#include "rdzv/tcp_store.hpp"

namespace rdzv::detail {

// A connected, authenticated, non-blocking socket. Throws StoreConnectionError (no
// server within options.connect_timeout, or it refused the connection) or
// StoreAuthError (our token refused, or the server could not prove it knows it).
int connect_and_authenticate(const TcpStoreOptions& options);

}  // namespace rdzv::detail
