// Reading the worker exit records of an attempt back from the job's store (written by
// exit_publisher.hpp; keys in ddp/contract/store_keys.hpp).
#pragma once

#include <map>

#include "ddp/contract/job_records.hpp"
#include "rdzv/store.hpp"

namespace ddprun {

// Every worker exit of `attempt` published so far, by global rank (the last record of a
// rank wins). A slot taken but not yet written is skipped. Each store call is bounded;
// throws rdzv::StoreError when the store cannot be read.
std::map<int, ddp::contract::ExitRecord> read_exits(rdzv::Store& store, int attempt);

}  // namespace ddprun
