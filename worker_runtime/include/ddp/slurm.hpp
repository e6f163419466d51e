// Facts about a Slurm job that ddprun and the worker runtime read from its environment.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::slurm {

// Expands a Slurm hostlist expression into host names, in order:
//   "node[01-04,07],gpu-a[1-2]" -> node01 node02 node03 node04 node07 gpu-a1 gpu-a2
//   "rack[1-2]-n[1-2]"          -> rack1-n1 rack1-n2 rack2-n1 rack2-n2
// Zero padding follows the range's first number. Throws std::invalid_argument naming
// the problem for a malformed expression or one that expands past `max_hosts`.
std::vector<std::string> expand_hostlist(std::string_view expression, size_t max_hosts = 1'000'000);

// The port a job step's rendezvous store listens on at its first node: derived from the
// job and step ids so steps sharing nodes do not collide, and kept in 10000-29999,
// below Linux's ephemeral port range.
int rendezvous_port(long job_id, long step_id);

// "2(x3),1" (SLURM_TASKS_PER_NODE) -> the count for node `node` (here 2 for nodes 0-2).
// Throws std::invalid_argument for a malformed value or a node past the list.
int tasks_on_node(std::string_view tasks_per_node, int node);

}  // namespace ddp::slurm
