// Liveness for store connections: TCP keepalive probes and a user timeout sized so
// that a peer that stops answering (host down, link cut) is dropped within about
// `timeout`, while an idle but healthy connection costs nothing.
#pragma once

#include "rdzv/store.hpp"

namespace rdzv {

void set_liveness_options(int fd, Millis timeout);

}  // namespace rdzv
