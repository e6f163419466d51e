// Progress a training program reports, for `ddprun status` and ddprun's stall reports.
//
//   for (auto& batch : loader) { train_on(batch); ddp::report_step(); }
//
// report_step() counts one optimizer step of this process: thread-safe, a few
// nanoseconds, never blocks or fails. DistributedDataParallel counts its own steps
// (each backward() that reduces the gradients), so a program that trains with it does
// not call report_step() as well. Under ddprun, ddp::init() publishes the count with
// the rest of this rank's progress about once a second; elsewhere it is only counted.
#pragma once

#include <cstdint>

namespace ddp {

// Counts one optimizer step.
void report_step();
// The steps counted so far in this process.
uint64_t reported_steps();

}  // namespace ddp
