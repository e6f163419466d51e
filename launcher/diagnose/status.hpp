// `ddprun status`: one line per rank of a running job, read from the job's store
// (progress records, exit records, stall reports) and, for this node's workers, /proc.
//
//   ddprun status                              the running local job (runtime_file.hpp)
//   ddprun status --run_id ID                  one of several local jobs
//   ddprun status --rdzv_endpoint H:P --rdzv_id ID   a job served by ddp-rendezvous
//                                              (token: DDPRUN_TOKEN or --rdzv_token_file)
//   --json                                     one JSON object, for scripts
//   --watch [S]                                refresh every S seconds (default 2)
//
// "status" is a subcommand only as ddprun's first argument.
#pragma once

namespace ddprun {

// Runs the subcommand; argv[0] is "status". Returns the exit status: 0 shown, 1 no
// job found or its store unreachable, 2 a bad command line.
int run_status(int argc, const char* const* argv);

}  // namespace ddprun
