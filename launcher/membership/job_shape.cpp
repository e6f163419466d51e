#include "membership/job_shape.hpp"

#include "ddp/contract/store_keys.hpp"
#include "errors.hpp"

namespace ddprun {
namespace {

// "2 nodes", "1:4 nodes".
std::string nodes_text(const std::string& nnodes) { return nnodes + (nnodes == "1" ? " node" : " nodes"); }

std::string processes_text(const std::string& nproc) {
  return nproc + (nproc == "1" ? " process" : " processes");
}

}  // namespace

void check_job_shape(rdzv::Store& store, const std::string& job, const LaunchPlan& plan) {
  const LaunchOptions& o = plan.options;
  const std::string nnodes = o.elastic() ? std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes)
                                         : std::to_string(o.nnodes);
  const std::string nproc = std::to_string(plan.nproc);
  const std::string mine = nnodes + "\n" + nproc;
  const std::string recorded = store.compare_set(ddp::contract::JobKeys::shape(), "", mine);
  const auto newline = recorded.find('\n');
  const std::string their_nnodes = recorded.substr(0, newline);
  const std::string their_nproc = newline == std::string::npos ? "?" : recorded.substr(newline + 1);
  const std::string running = "rendezvous: job '" + job + "' is already running with ";
  if (their_nnodes != nnodes) {
    throw UsageError(running + nodes_text(their_nnodes) + " × " + processes_text(their_nproc) +
                     "; this launch asks for " + nodes_text(nnodes) + " × " + processes_text(nproc) +
                     " (another job with this --rdzv_id, or a node given another --nnodes)");
  }
  if (o.elastic()) return;  // elastic nodes have no rank of their own to compare at
  const std::string claimed = store.compare_set(ddp::contract::JobKeys::node_shape(o.node_rank), "", nproc);
  if (claimed != nproc) {
    throw UsageError(running + nodes_text(nnodes) + ", node rank " + std::to_string(o.node_rank) + " with " +
                     processes_text(claimed) + "; this launch asks for node rank " + std::to_string(o.node_rank) +
                     " with " + processes_text(nproc) + " (another job with this --rdzv_id?)");
  }
}

}  // namespace ddprun
