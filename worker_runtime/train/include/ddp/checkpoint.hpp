// Training checkpoints: model parameters, optimizer state, epoch and step in one
// file, written atomically and verified when read.
//
// File layout (little-endian): magic "DDPCKPT\0", u32 version, u64 payload size,
// u32 CRC-32 of the payload, then the payload: epoch and step (i64), the run id
// (version 2; version 1 files, which lack it, still load), the parameter count and
// for each parameter its name, shape and float32 values, and the optimizer's kind
// and state (Optimizer::save_state) if one was saved.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/nn.hpp"
#include "ddp/optim.hpp"

namespace ddp {

// Where training stands when a checkpoint is taken.
struct CheckpointInfo {
  int64_t epoch = 0;  // e.g. the next epoch to run
  int64_t step = 0;   // optimizer steps taken so far
  // The job that wrote it (TORCHELASTIC_RUN_ID; empty: unknown), so that a job the
  // launcher restarts or re-forms can tell its own checkpoint from another run's.
  std::string run_id;
};

// Writes model's parameter values, optimizer's state (when optimizer is not null)
// and info to path atomically: a temporary file in the same directory is written,
// fsync'ed and renamed over path, so a crash leaves either the old or the new file.
// The temporary file is "<path>.tmp.<machine id>.<pid>.<start time>" (machine id: 8
// hex digits hashing the host name and pid namespace); a failed save removes its own,
// and each save first removes those of writers on this host that are gone (killed
// mid-save). Two machines with the same host name, both in the initial pid namespace,
// that share the folder (NFS) cannot be told apart: a save on one may remove a temporary
// file that a live writer on the other is filling (its rename then fails). Temporary
// files of the older scheme "<path>.tmp.<pid>" are never removed: delete them by hand.
// Throws ddp::Error naming the file on any I/O failure.
void save_checkpoint(const std::string& path, Module& model, const Optimizer* optimizer, const CheckpointInfo& info);

// Reads a checkpoint written by save_checkpoint into model (and optimizer, when not
// null) and returns its info. Everything is validated before anything is changed:
// magic, version, size, CRC-32, and that the parameter names and shapes (and the
// optimizer kind) match. Throws ddp::Error naming the file and the problem on a
// missing, truncated, corrupted or mismatched checkpoint; model and optimizer are
// then left as they were.
CheckpointInfo load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer);

// The two halves of load_checkpoint, for a job whose checkpoint only one rank can
// read (a node-local path): that rank reads the file's bytes (throws ddp::Error
// naming it when it cannot), broadcasts them, and every rank loads them. `path`
// only names the checkpoint in error messages.
std::string read_checkpoint_file(const std::string& path);
// The info of a checkpoint's bytes, validated as load_checkpoint_bytes validates
// the header, without a model: whether to resume can be decided before loading.
CheckpointInfo checkpoint_info(const std::string& bytes, const std::string& path);
CheckpointInfo load_checkpoint_bytes(const std::string& bytes, const std::string& path, Module& model,
                                     Optimizer* optimizer);
// Only the optimizer half of a checkpoint's bytes, for an optimizer built after the
// model was loaded (sharded strategies wrap the full model first, then shard it): the
// same validation, and an error when the checkpoint holds no optimizer state or
// another kind. A ShardedOptimizer keeps its slice of the full per-parameter state.
void load_optimizer_state(const std::string& bytes, const std::string& path, Optimizer& optimizer);

}  // namespace ddp
