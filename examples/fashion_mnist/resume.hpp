// Resuming fashion_mnist from its checkpoint: whether to, decided once by rank 0
// and shared with every rank, and the loading itself.
//
// A job that the launcher restarts (a worker failed) or re-forms (an elastic job
// lost a node or gained one) runs the program again from the start, with the same
// flags. So the program resumes by itself from a checkpoint its own run wrote (the
// same TORCHELASTIC_RUN_ID, which stays through every restart and re-forming, where
// TORCHELASTIC_RESTART_COUNT does not change when a node joins). A checkpoint of
// another run is only used with --resume; without it the run says that it starts
// afresh, and overwrites that file. torchrun's default run id "none" is every such
// job's: its checkpoint is taken as this run's only once the job has restarted
// (a first attempt finds none of its own).
#pragma once

#include <optional>
#include <string>

#include "ddp/checkpoint.hpp"     // CheckpointInfo
#include "ddp/nn.hpp"             // Module
#include "ddp/process_group.hpp"  // ProcessGroup

namespace fashion_mnist {

struct ResumeOptions {
  std::string checkpoint;  // --checkpoint (empty: none, nothing to resume)
  bool resume = false;     // --resume: continue from the checkpoint whoever wrote it
  std::string run_id;      // this run's id (TORCHELASTIC_RUN_ID); empty: unknown
  int restart_count = 0;   // TORCHELASTIC_RESTART_COUNT
};

// Whether `run_id` names one run: torchrun's default rendezvous id "none" (and an
// empty one) is shared by unrelated jobs, so it cannot tell a checkpoint's owner.
bool identifies_a_run(const std::string& run_id);

// Whether a checkpoint stamped `written_by` is this run's own (see above).
bool own_checkpoint(const ResumeOptions& options, const std::string& written_by);

// What resume_from_checkpoint found: the checkpoint's info, and its bytes for the
// optimizer, which is built only after the model is wrapped (load_optimizer_state).
struct Resumed {
  ddp::CheckpointInfo info;
  std::string bytes;
};

// Collective (every rank calls it): rank 0 reads the checkpoint and decides; when
// it resumes, every rank loads the same bytes into the model (full, before any
// strategy wraps it: a checkpoint of any strategy and world size fits) and gets them
// back for the optimizer. nullopt: start from the beginning (rank 0 printed why, when
// there was a checkpoint it did not use). Throws ddp::Error on every rank when
// --resume was given and the checkpoint cannot be read.
std::optional<Resumed> resume_from_checkpoint(const ResumeOptions& options, ddp::ProcessGroup& pg,
                                              ddp::Module& model);

// The same decision without a model: every rank gets the checkpoint's info and bytes
// and loads them itself (a model-parallel rank cuts its blocks out of them).
std::optional<Resumed> resume_from_checkpoint(const ResumeOptions& options, ddp::ProcessGroup& pg);

}  // namespace fashion_mnist
