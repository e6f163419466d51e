// Little helpers to write and read plain values and float arrays on binary streams
// (optimizer state, checkpoints). Reads throw ddp::Error on a short stream.
#pragma once

#include <cstdint>
#include <istream>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/tensor.hpp"
#include "ddp/types.hpp"

namespace ddp::binary_io {

// An input stream over memory someone else owns (a checkpoint's bytes), read without
// copying it; seekable within it. The memory must outlive the stream.
class MemoryBuffer : public std::streambuf {
 public:
  MemoryBuffer(const char* data, size_t size) {
    char* p = const_cast<char*>(data);  // the get area is only read
    setg(p, p, p + size);
  }

 protected:
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode which) override {
    if ((which & std::ios_base::in) == 0) return pos_type(off_type(-1));
    char* base = dir == std::ios_base::beg ? eback() : dir == std::ios_base::cur ? gptr() : egptr();
    if (off < eback() - base || off > egptr() - base) return pos_type(off_type(-1));
    setg(eback(), base + off, egptr());
    return pos_type(gptr() - eback());
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override {
    return seekoff(off_type(pos), std::ios_base::beg, which);
  }
};

class MemoryStream : private MemoryBuffer, public std::istream {
 public:
  MemoryStream(const char* data, size_t size) : MemoryBuffer(data, size), std::istream(this) {}
  explicit MemoryStream(std::string_view bytes) : MemoryStream(bytes.data(), bytes.size()) {}
};

// Values are stored in the host's byte order; every platform ddprun targets
// (x86-64, aarch64) is little-endian, as the checkpoint format states.
template <typename T>
void put(std::ostream& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  out.write(reinterpret_cast<const char*>(&value), sizeof value);
}

template <typename T>
T get(std::istream& in, const char* what) {
  static_assert(std::is_trivially_copyable_v<T>);
  T value{};
  if (!in.read(reinterpret_cast<char*>(&value), sizeof value)) {
    throw Error(std::string("truncated data reading ") + what);
  }
  return value;
}

inline void put_string(std::ostream& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

inline std::string get_string(std::istream& in, const char* what, uint32_t max_len = 4096) {
  const auto n = get<uint32_t>(in, what);
  if (n > max_len) throw Error(std::string("implausible length ") + std::to_string(n) + " reading " + what);
  std::string s(n, '\0');
  if (n != 0 && !in.read(s.data(), n)) throw Error(std::string("truncated data reading ") + what);
  return s;
}

// A tensor as u64 rows, u64 cols, rows*cols floats.
// A CUDA tensor is copied to the host first.
inline void put_tensor(std::ostream& out, const Tensor& t) {
  if (t.is_cuda()) {
    put_tensor(out, t.to(Device::Cpu));
    return;
  }
  put<uint64_t>(out, t.rows());
  put<uint64_t>(out, t.cols());
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)));
}

// Reads a tensor written by put_tensor, into host memory; its shape must be
// rows × cols (the caller's expectation), else ddp::Error.
inline Tensor get_tensor(std::istream& in, size_t rows, size_t cols, const std::string& what) {
  const auto r = get<uint64_t>(in, what.c_str());
  const auto c = get<uint64_t>(in, what.c_str());
  if (r != rows || c != cols) {
    throw Error(what + ": stored shape " + std::to_string(r) + "x" + std::to_string(c) + ", expected " +
                std::to_string(rows) + "x" + std::to_string(cols));
  }
  Tensor t(rows, cols);
  if (t.size() != 0 && !in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)))) {
    throw Error("truncated data reading " + what);
  }
  return t;
}

// The shape put_tensor wrote, whatever it is, as long as its values take at most
// `limit` bytes (the rest of the stream, say); ddp::Error otherwise.
inline std::pair<uint64_t, uint64_t> get_any_shape(std::istream& in, uint64_t limit, const std::string& what) {
  const auto rows = get<uint64_t>(in, what.c_str());
  const auto cols = get<uint64_t>(in, what.c_str());
  if ((cols != 0 && rows > limit / cols) || rows * cols > limit / sizeof(float)) {
    throw Error(what + ": implausible shape");
  }
  return {rows, cols};
}

// Reads a tensor written by put_tensor whatever its shape (values of at most `limit`
// bytes), into host memory.
inline Tensor get_any_tensor(std::istream& in, uint64_t limit, const std::string& what) {
  const auto [rows, cols] = get_any_shape(in, limit, what);
  Tensor t(rows, cols);
  if (t.size() != 0 && !in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)))) {
    throw Error("truncated data reading " + what);
  }
  return t;
}

}  // namespace ddp::binary_io
