// The job policy's interfaces over the Supervisor, the store and the failure summary
// (job_adapters.hpp).
#include "job_adapters.hpp"

#include "ddp/contract/store_keys.hpp"
#include "diagnose/summary.hpp"
#include "supervise/error_files.hpp"

namespace ddprun {

void SupervisorWorkers::prepare(int attempt) {
  if (plan_.log_root && (attempt > 0 || joins_others_)) create_log_dirs(plan_, attempt);
}

JobLayout SingleNodeMembership::join(int attempt) {
  JobLayout layout;
  layout.attempt = attempt;
  layout.restart_count = attempt;
  layout.world_size = plan_.nproc;
  layout.master_addr = plan_.options.master_addr;
  layout.master_port = plan_.master_port;
  layout.store.addr = link_.options().host;
  layout.store.port = link_.options().port;
  layout.store.token = link_.options().token;
  layout.store.prefix = contract::JobKeys(attempt).process_groups();
  layout.store.attempt = attempt;
  worker_store_.serve_attempt(layout.store.ns, attempt);
  return layout;
}

std::string SummaryReports::failure_summary(const AttemptResult& result, int attempt,
                                            const std::string& next) const {
  return format_failure_summary(plan_, result, attempt, next);
}

std::string SummaryReports::incomplete_logs(const AttemptResult& result) const {
  return format_incomplete_logs(result);
}

std::string SummaryReports::worker_exception(const WorkerOutcome& worker) const {
  std::optional<WorkerError> error = read_worker_error(worker.error_file);
  return error ? error->message : std::string();
}

}  // namespace ddprun
