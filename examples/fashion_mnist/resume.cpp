// Resuming fashion_mnist from its checkpoint (see resume.hpp).
#include "resume.hpp"

#include <cstdio>
#include <filesystem>
#include <span>
#include <system_error>
#include <utility>

#include "ddp/types.hpp"  // Error

namespace fashion_mnist {
namespace {

// What rank 0 sends: {kind, length} then `length` bytes: the file to resume from,
// or why it could not be read (so every rank fails with that reason, not with
// "rank 0 died").
enum : int64_t { kNone = 0, kFile = 1, kUnreadable = 2 };

struct Decision {
  int64_t kind = kNone;
  std::string bytes;  // kFile: the checkpoint; kUnreadable: the reason
};

std::string run_name(const std::string& run_id) { return run_id.empty() ? "an unnamed run" : "run '" + run_id + "'"; }

// Rank 0 only: reads the checkpoint and tells whether this run continues from it.
// Every checkpoint it finds and does not use is said on stdout: a run that starts
// from epoch 1 beside a checkpoint must not look like one that resumed.
Decision decide(const ResumeOptions& o) {
  std::error_code ec;
  if (o.checkpoint.empty() || !std::filesystem::exists(o.checkpoint, ec)) return {};
  std::string bytes;
  ddp::CheckpointInfo info;
  try {
    bytes = ddp::read_checkpoint_file(o.checkpoint);
    info = ddp::checkpoint_info(bytes, o.checkpoint);
  } catch (const ddp::Error& e) {
    if (o.resume) return {kUnreadable, e.what()};
    std::printf("not resuming: %s; starting from epoch 1\n", e.what());
    return {};
  }
  if (o.resume || own_checkpoint(o, info.run_id)) return {kFile, std::move(bytes)};
  const std::string why = info.run_id != o.run_id
                              ? "it was written by " + run_name(info.run_id) + ", this is " + run_name(o.run_id)
                              : "this run's id '" + o.run_id + "' is not unique to it (give the launcher --rdzv_id)";
  std::printf("not resuming from %s: %s; starting from epoch 1 and overwriting it (--resume continues from it)\n",
              o.checkpoint.c_str(), why.c_str());
  return {};
}

}  // namespace

bool identifies_a_run(const std::string& run_id) { return !run_id.empty() && run_id != "none"; }

bool own_checkpoint(const ResumeOptions& options, const std::string& written_by) {
  if (written_by != options.run_id) return false;
  return identifies_a_run(options.run_id) || options.restart_count > 0;
}

std::optional<Resumed> resume_from_checkpoint(const ResumeOptions& options, ddp::ProcessGroup& pg,
                                              ddp::Module& model) {
  std::optional<Resumed> r = resume_from_checkpoint(options, pg);
  if (r) ddp::load_checkpoint_bytes(r->bytes, options.checkpoint, model, nullptr);
  return r;
}

std::optional<Resumed> resume_from_checkpoint(const ResumeOptions& options, ddp::ProcessGroup& pg) {
  if (options.checkpoint.empty()) return std::nullopt;  // the same on every rank: no collective needed
  // Rank 0 wrote the checkpoint, so rank 0 reads it and sends its bytes to every
  // rank: all of them resume alike even where the path exists on rank 0's node only.
  Decision d = pg.rank() == 0 ? decide(options) : Decision{};
  int64_t head[2] = {d.kind, static_cast<int64_t>(d.bytes.size())};
  pg.broadcast(ddp::view(std::span<int64_t>(head, 2)), 0);
  d.bytes.resize(static_cast<size_t>(head[1]));
  if (head[0] != kNone) pg.broadcast(ddp::Buffer{d.bytes.data(), d.bytes.size(), ddp::DType::U8}, 0);
  if (head[0] == kUnreadable) throw ddp::Error("--resume: " + d.bytes);
  if (head[0] != kFile) return std::nullopt;
  Resumed r;
  r.info = ddp::checkpoint_info(d.bytes, options.checkpoint);
  r.bytes = std::move(d.bytes);
  return r;
}

}  // namespace fashion_mnist
