// Ranks of one real CPU process group, forked from the test over a real store (for
// comm tests of the CPU backend's algorithms), and a helper to compare the ranks'
// line-per-case reports whatever their order.
#pragma once

#include <catch2/catch.hpp>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "group_setup.hpp"
#include "forked.hpp"
#include "rdzv/tcp_store.hpp"
#include "server_fixture.hpp"

namespace testing {

// Runs body(group) on `n` forked ranks of one CPU group; returns each rank's payload
// (REQUIREs that every rank returned).
inline std::vector<std::string> on_ranks(int n, const std::function<std::string(ddp::ProcessGroup&)>& body) {
  using namespace std::chrono_literals;
  ServerThread server;
  auto keeper = server.client();
  const auto options = server.client_options();
  std::vector<ForkedChild> children;
  for (int rank = 0; rank < n; ++rank) {
    children.emplace_back([rank, n, options, body] {
      ddp::detail::GroupSetup setup;
      setup.store = std::make_shared<rdzv::TcpStore>(options);
      setup.rank = rank;
      setup.size = n;
      setup.local_size = n;
      setup.timeout = 30s;
      setup.connect_timeout = 30s;
      ddp::ProcessGroup group(ddp::detail::make_cpu_backend(setup));
      return body(group);
    });
  }
  std::vector<std::string> out;
  for (int rank = 0; rank < n; ++rank) {
    const auto result = children[static_cast<size_t>(rank)].wait(60s);
    INFO("rank " << rank << " exited with " << result.status << ": " << result.payload);
    REQUIRE(result.ok);
    out.push_back(result.payload);
  }
  return out;
}

// Sorted lines, so a report's order does not matter.
inline std::string sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) lines.push_back(text.substr(start, nl - start));
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace testing
