// save_checkpoint / load_checkpoint: an atomically written, CRC-checked file.
//
// Layout (see ddp/checkpoint.hpp): a 24-byte header (magic, version, payload size,
// CRC-32) and the payload:
//   i64 epoch, i64 step, string run id (version 2 on), u64 parameter count,
//   per parameter: string name, tensor value (binary_io::put_tensor),
//   u8 has optimizer, and if set: u64 state size + Optimizer::save_state bytes.
#include "ddp/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <sstream>
#include <string>
#include <vector>

#include "binary_io.hpp"
#include "checkpoint_format.hpp"
#include "ddp/types.hpp"
#include "temp_file.hpp"

namespace ddp {
namespace {

using binary_io::get;
using binary_io::put;

constexpr char kMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '\0'};
// Version 2 added the run id; version 1 files are still read (their run id is empty).
constexpr uint32_t kVersion = 2;
constexpr uint32_t kOldestVersion = 1;
constexpr size_t kHeaderSize = 8 + 4 + 8 + 4;
constexpr uint32_t kMaxRunId = 4096;  // binary_io::get_string's default limit

// The CRC-32 of `size` bytes at `data` continued from `crc` (crc32_of(nullptr, 0) starts one).
uint32_t crc32_of(const char* data, size_t size, uint32_t crc = 0) {
  uLong c = crc;
  const auto* p = reinterpret_cast<const Bytef*>(data);
  while (size > 0) {  // crc32 takes a uInt length
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    c = crc32(c, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(c);
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": write failed: " + errno_text());
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// The payload of a checkpoint's bytes after checking the header (magic, version,
// size, CRC-32); throws Error naming `path` otherwise.
std::string_view checked_payload(const std::string& bytes, const std::string& path, uint32_t& version) {
  if (bytes.size() < kHeaderSize) {
    throw Error(path + ": not a checkpoint (truncated header: " + std::to_string(bytes.size()) + " bytes)");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) throw Error(path + ": not a checkpoint (bad magic)");
  uint64_t size;
  uint32_t crc;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&size, bytes.data() + 12, 8);
  std::memcpy(&crc, bytes.data() + 20, 4);
  if (version < kOldestVersion || version > kVersion) {
    throw Error(path + ": checkpoint version " + std::to_string(version) + ", this build reads versions " +
                std::to_string(kOldestVersion) + " to " + std::to_string(kVersion));
  }
  const size_t have = bytes.size() - kHeaderSize;
  if (size != have) {
    throw Error(path + ": checkpoint payload is " + std::to_string(have) + " bytes, header says " +
                std::to_string(size) + (have < size ? " (truncated)" : " (trailing bytes)"));
  }
  const std::string_view body = std::string_view(bytes).substr(kHeaderSize);
  if (crc32_of(body.data(), body.size()) != crc) throw Error(path + ": checkpoint checksum mismatch (file is corrupted)");
  return body;
}

// The payload's first fields (epoch, step, run id).
CheckpointInfo get_info(std::istream& in, uint32_t version) {
  CheckpointInfo info;
  info.epoch = get<int64_t>(in, "epoch");
  info.step = get<int64_t>(in, "step");
  if (version >= 2) info.run_id = binary_io::get_string(in, "run id", kMaxRunId);
  return info;
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open checkpoint: " + errno_text());
  std::string bytes;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      ::close(fd);
      throw Error(path + ": read failed: " + why);
    }
    if (n == 0) break;
    bytes.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

// Reads (or, without `out`, skips) a tensor written by binary_io::put_tensor whatever
// its shape (no model to check it against), without reading past the payload.
void stored_tensor(std::istream& in, size_t payload, const std::string& what, Tensor* out) {
  if (out != nullptr) {
    *out = binary_io::get_any_tensor(in, payload, what);
    return;
  }
  const auto [rows, cols] = binary_io::get_any_shape(in, payload, what);
  if (!in.seekg(static_cast<std::streamoff>(rows * cols * sizeof(float)), std::ios::cur) || in.tellg() < 0 ||
      static_cast<uint64_t>(in.tellg()) > payload) {
    throw Error("truncated data reading " + what);
  }
}

// Loads the parsed optimizer state into `optimizer`, all or nothing. load_state leaves
// the state as it was when what it reads is wrong, but only the end of the stream shows
// trailing bytes: a copy of the current state (state() deep-copied; save_state would not
// do for a sharded optimizer, which writes only after consolidating) is put back then.
void apply_optimizer_state(const checkpoint_format::Contents& parsed, Optimizer& optimizer) {
  if (!parsed.has_optimizer) throw Error(std::string("checkpoint holds no optimizer state"));
  const OptimizerState live = optimizer.state();  // views of the optimizer's buffers
  const OptimizerState before = live;             // Tensor's copy is deep
  binary_io::MemoryStream state_in(parsed.state);
  optimizer.load_state(state_in);
  if (state_in.peek() != std::char_traits<char>::eof()) {
    optimizer.set_state(before);
    throw Error(std::string("trailing data after the optimizer state"));
  }
}

}  // namespace

namespace checkpoint_format {

void write(const std::string& path, const CheckpointInfo& info, const std::vector<NamedTensor>& params,
           const std::string* optimizer_state) {
  if (info.run_id.size() > kMaxRunId) {
    throw InvalidArgument(path + ": run id of " + std::to_string(info.run_id.size()) + " bytes, at most " +
                          std::to_string(kMaxRunId) + " fit a checkpoint");
  }
  // Payload, as pieces written one after the other: the small fields serialized here,
  // the tensors' values and the optimizer state straight from their memory (no copy of
  // the whole payload is made).
  std::deque<std::string> fields;  // stable addresses for the pieces
  std::deque<Tensor> host_copies;  // device tensors' values, brought to the host
  std::vector<std::pair<const char*, size_t>> pieces;
  std::ostringstream field(std::ios::binary);
  const auto end_field = [&] {
    fields.push_back(field.str());
    pieces.emplace_back(fields.back().data(), fields.back().size());
    field.str({});
  };
  put<int64_t>(field, info.epoch);
  put<int64_t>(field, info.step);
  binary_io::put_string(field, info.run_id);
  put<uint64_t>(field, params.size());
  for (const NamedTensor& p : params) {
    binary_io::put_string(field, *p.name);
    put<uint64_t>(field, p.value->rows());
    put<uint64_t>(field, p.value->cols());
    end_field();
    const Tensor* t = p.value;
    if (t->is_cuda()) t = &host_copies.emplace_back(t->to(Device::Cpu));
    pieces.emplace_back(reinterpret_cast<const char*>(t->data()), t->size() * sizeof(float));
  }
  put<uint8_t>(field, optimizer_state != nullptr ? 1 : 0);
  if (optimizer_state != nullptr) put<uint64_t>(field, optimizer_state->size());
  end_field();
  if (optimizer_state != nullptr) pieces.emplace_back(optimizer_state->data(), optimizer_state->size());
  uint64_t body_size = 0;
  uint32_t crc = crc32_of(nullptr, 0);
  for (const auto& [data, size] : pieces) {
    body_size += size;
    crc = crc32_of(data, size, crc);
  }

  // Header.
  std::ostringstream head(std::ios::binary);
  head.write(kMagic, sizeof kMagic);
  put<uint32_t>(head, kVersion);
  put<uint64_t>(head, body_size);
  put<uint32_t>(head, crc);
  const std::string header = head.str();

  // Temporary file in the same directory, fsync, rename, fsync the directory. Those
  // that writers killed mid-save left go first (temp_file.hpp).
  temp_file::remove_stale(path);
  const std::string tmp = temp_file::name_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(tmp + ": cannot create checkpoint file: " + errno_text());
  // From here every way out but the rename removes the temporary file.
  struct RemoveUnlessRenamed {
    const std::string& tmp;
    bool renamed = false;
    ~RemoveUnlessRenamed() {
      if (!renamed) ::unlink(tmp.c_str());
    }
  } guard{tmp};
  try {
    write_all(fd, header.data(), header.size(), tmp);
    for (const auto& [data, size] : pieces) write_all(fd, data, size, tmp);
    if (::fsync(fd) != 0) throw Error(tmp + ": fsync failed: " + errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(tmp + ": close failed: " + errno_text());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw Error(path + ": cannot rename the checkpoint into place: " + errno_text());
  }
  guard.renamed = true;
  const std::string dir = temp_file::directory_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // makes the rename durable; a filesystem refusing it is not fatal
    ::fsync(dfd);
    ::close(dfd);
  }
}

Contents read(const std::string& bytes, const std::string& path, const std::vector<ParamSpec>* expect,
              bool read_values) {
  uint32_t version = 0;
  const std::string_view body = checked_payload(bytes, path, version);
  const size_t have = body.size();
  try {
    binary_io::MemoryStream in(body);
    Contents out;
    out.info = get_info(in, version);
    const auto count = get<uint64_t>(in, "parameter count");
    if (expect != nullptr && count != expect->size()) {
      throw Error("checkpoint has " + std::to_string(count) + " parameters, the model has " +
                  std::to_string(expect->size()));
    }
    if (count > have) throw Error("implausible parameter count " + std::to_string(count));
    out.names.reserve(count);
    if (expect != nullptr || read_values) out.values.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      out.names.push_back(binary_io::get_string(in, "parameter name"));
      const std::string& name = out.names.back();
      if (expect == nullptr) {
        if (read_values) out.values.emplace_back();
        stored_tensor(in, have, "parameter " + name, read_values ? &out.values.back() : nullptr);
        continue;
      }
      const ParamSpec& p = (*expect)[i];
      if (name != p.name) throw Error("checkpoint parameter '" + name + "' where the model has '" + p.name + "'");
      out.values.push_back(binary_io::get_tensor(in, p.rows, p.cols, "parameter " + name));
    }
    const auto has_optimizer = get<uint8_t>(in, "optimizer flag");
    if (has_optimizer > 1) throw Error(std::string("bad optimizer flag"));
    out.has_optimizer = has_optimizer == 1;
    if (out.has_optimizer) {
      const auto state_size = get<uint64_t>(in, "optimizer state size");
      if (state_size > have) throw Error(std::string("optimizer state size exceeds the file"));
      const auto at = static_cast<size_t>(in.tellg());
      if (state_size > have - at) throw Error(std::string("truncated data reading optimizer state"));
      out.state = body.substr(at, state_size);
      in.seekg(static_cast<std::streamoff>(state_size), std::ios::cur);
    }
    if (in.peek() != std::char_traits<char>::eof()) throw Error(std::string("trailing data after the checkpoint"));
    return out;
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace checkpoint_format

void save_checkpoint(const std::string& path, Module& model, const Optimizer* optimizer, const CheckpointInfo& info) {
  const std::vector<Parameter*> params = model.parameters();
  std::vector<checkpoint_format::NamedTensor> named;
  named.reserve(params.size());
  for (const Parameter* p : params) named.push_back({&p->name, &p->value});
  std::string state;
  if (optimizer != nullptr) {
    std::ostringstream out(std::ios::binary);
    optimizer->save_state(out);
    state = std::move(out).str();  // moves the buffer out (C++20)
  }
  checkpoint_format::write(path, info, named, optimizer != nullptr ? &state : nullptr);
}

CheckpointInfo load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer) {
  return load_checkpoint_bytes(read_file(path), path, model, optimizer);
}

std::string read_checkpoint_file(const std::string& path) { return read_file(path); }

CheckpointInfo checkpoint_info(const std::string& bytes, const std::string& path) {
  uint32_t version = 0;
  binary_io::MemoryStream in(checked_payload(bytes, path, version));
  try {
    return get_info(in, version);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

CheckpointInfo load_checkpoint_bytes(const std::string& bytes, const std::string& path, Module& model,
                                     Optimizer* optimizer) {
  const std::vector<Parameter*> params = model.parameters();
  std::vector<checkpoint_format::ParamSpec> expect;
  expect.reserve(params.size());
  for (const Parameter* p : params) expect.push_back({p->name, p->value.rows(), p->value.cols()});
  const checkpoint_format::Contents parsed = checkpoint_format::read(bytes, path, &expect, true);
  if (optimizer != nullptr) {
    try {
      apply_optimizer_state(parsed, *optimizer);
    } catch (const Error& e) {
      throw Error(path + ": " + e.what());
    }
  }
  for (size_t i = 0; i < params.size(); ++i) params[i]->value.copy_from(parsed.values[i]);
  return parsed.info;
}

void load_optimizer_state(const std::string& bytes, const std::string& path, Optimizer& optimizer) {
  const checkpoint_format::Contents parsed = checkpoint_format::read(bytes, path, nullptr, false);
  try {
    apply_optimizer_state(parsed, optimizer);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace ddp
