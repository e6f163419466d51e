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

std::string shared_job_id_message(const std::string& job, const std::string& where) {
  return "rendezvous: another job uses --rdzv_id " + job + " at " + where + "; give each job its own --rdzv_id";
}

void check_job_shape(rdzv::Store& store, const std::string& job, const LaunchPlan& plan, const std::string& where) {
  const LaunchOptions& o = plan.options;
  // Ranks by arrival meet in rounds of MIN = MAX: "N:N" keeps them apart from nodes that
  // give their rank (which wait for the others under fixed node keys).
  const std::string nnodes = o.elastic_rounds() ? std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes)
                                                : std::to_string(o.nnodes);
  const std::string nproc = std::to_string(plan.nproc);
  const std::string mine = nnodes + "\n" + nproc;
  const std::string recorded = store.compare_set(ddp::contract::JobKeys::shape(), "", mine);
  const auto newline = recorded.find('\n');
  const std::string their_nnodes = recorded.substr(0, newline);
  const std::string their_nproc = newline == std::string::npos ? "?" : recorded.substr(newline + 1);
  const std::string running = "rendezvous: job '" + job + "' is already running with ";
  const std::string n = std::to_string(o.nnodes);
  if ((their_nnodes == n + ":" + n && nnodes == n) || (their_nnodes == n && nnodes == n + ":" + n)) {
    throw UsageError(running + "nodes that " + (nnodes == n ? "take their rank by arrival" : "give --node_rank") +
                     "; this one " + (nnodes == n ? "gives --node_rank" : "does not") +
                     ": give every node of a job its --node_rank, or none (another job with this --rdzv_id?)");
  }
  if (their_nnodes != nnodes) {
    throw UsageError(running + nodes_text(their_nnodes) + " × " + processes_text(their_nproc) +
                     "; this launch asks for " + nodes_text(nnodes) + " × " + processes_text(nproc) +
                     " (another job with this --rdzv_id, or a node given another --nnodes)");
  }
  if (o.elastic_rounds()) return;  // these nodes have no rank of their own to compare at
  // A node rank is claimed once, by one launch: the same shape from another launch is another job.
  const std::string claim = nproc + "\n" + plan.launch_id;
  const std::string claimed = store.compare_set(ddp::contract::JobKeys::node_shape(o.node_rank), "", claim);
  const std::string claimed_nproc = claimed.substr(0, claimed.find('\n'));
  if (claimed_nproc != nproc) {
    throw UsageError(running + nodes_text(nnodes) + ", node rank " + std::to_string(o.node_rank) + " with " +
                     processes_text(claimed_nproc) + "; this launch asks for node rank " + std::to_string(o.node_rank) +
                     " with " + processes_text(nproc) + " (another job with this --rdzv_id?)");
  }
  if (claimed != claim) throw UsageError(shared_job_id_message(job, where));
}

}  // namespace ddprun
