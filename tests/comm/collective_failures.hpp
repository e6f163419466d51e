// collective_worker's failure modes (its usage is at the top of collective_worker.cpp):
// a rank that dies or stops calling, calls the ranks disagree on, caller mistakes.
// Each prints "rank R: ..." lines for the test to read and returns the exit status.
#pragma once

#include <cstddef>
#include <string>

#include "ddp/init.hpp"

namespace collective_failures {

// `victim` SIGKILLs itself while the others wait in an all_reduce.
int die(ddp::ProcessGroup& pg, int victim);
// `victim` stops calling collectives (alive); the others' all_reduce must time out.
int stuck(ddp::ProcessGroup& pg, int victim);
// The ranks disagree on a large all_reduce's count: every rank is refused.
int disagree(ddp::ProcessGroup& pg);
// Rank 0 makes another call (`what`) than the others: every rank fails with Mismatch.
int mismatch(ddp::ProcessGroup& pg, const std::string& what, size_t count, int global_rank);
// mismatch() in the group of global ranks 2 and 3 (4 ranks).
int mismatch_in_subgroup(ddp::ProcessGroup& pg, const std::string& what, size_t count, int global_rank);
// After one all_reduce, ranks 0 and 1 each recv from the other (a deadlock) and the
// others wait in a barrier; prints "rank R: deadlocked at <unix s>" first.
int deadlock(ddp::ProcessGroup& pg);
// Bad arguments: refused up front, or (a recv of the wrong size) the group breaks everywhere.
int misuse(ddp::ProcessGroup& pg);

}  // namespace collective_failures
