// What ddp-rendezvous --metrics-port serves: the store server's stats as Prometheus
// text exposition format 0.0.4 (README.md, "Metrics", names every series).
#pragma once

#include <string>

#include "rdzv/server.hpp"

namespace rdzv::metrics {

// The Content-Type of exposition()'s text.
inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every metric family with its # HELP and # TYPE lines, then its samples; counters end
// in _total. Families with a label list every value of it, zeros included, so a series
// exists from the first scrape on.
std::string exposition(const ServerStats& stats);

}  // namespace rdzv::metrics
