// IDX reader (gzip or plain, through zlib) and the Fashion-MNIST loader (dataset.hpp).
//
// IDX format: a 4-byte magic (0, 0, element type, number of dims), then each dim as
// a big-endian u32, then the elements row-major. Fashion-MNIST uses type 0x08
// (unsigned byte): images are 3-D (N, 28, 28), labels 1-D (N).
#include "dataset.hpp"

#include <sys/stat.h>
#include <zlib.h>

#include <string>

#include "ddp/types.hpp"

namespace fashion_mnist {

using ddp::Error;
using ddp::InvalidArgument;
using ddp::Tensor;

namespace {

constexpr size_t kMaxIdxBytes = size_t{1} << 30;  // refuse to inflate more than 1 GiB
constexpr uint8_t kUnsignedByte = 0x08;
constexpr size_t kMaxDims = 8;

// The whole (decompressed) content of path; gzread passes plain files through.
std::vector<uint8_t> read_all(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open (file not found)");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw Error(path + ": cannot open");
  gzbuffer(f, 1 << 18);
  std::vector<uint8_t> bytes;
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    const size_t old = bytes.size();
    if (old >= kMaxIdxBytes) {
      gzclose(f);
      throw Error(path + ": more than 1 GiB of data, not an IDX file of this dataset");
    }
    bytes.resize(old + kChunk);
    const int got = gzread(f, bytes.data() + old, static_cast<unsigned>(kChunk));
    if (got < 0) {
      int errnum = 0;
      const std::string msg = gzerror(f, &errnum);
      gzclose(f);
      throw Error(path + ": corrupt gzip data (" + msg + ")");
    }
    bytes.resize(old + static_cast<size_t>(got));
    if (got == 0) break;
  }
  int errnum = 0;
  const std::string msg = gzerror(f, &errnum);
  const int close_rc = gzclose(f);
  if (errnum != Z_OK || close_rc != Z_OK) {
    throw Error(path + ": corrupt or truncated gzip data (" + (errnum != Z_OK ? msg : std::string("close failed")) +
                ")");
  }
  return bytes;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// dir/name.gz if present, else dir/name; throws naming both when neither exists.
std::string find_file(const std::string& dir, const std::string& name) {
  const std::string base = dir + "/" + name;
  if (is_file(base + ".gz")) return base + ".gz";
  if (is_file(base)) return base;
  throw Error(base + ".gz not found (nor " + name + " uncompressed): apt install dataset-fashion-mnist");
}

std::string dims_text(const std::vector<uint32_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_all(path);
  if (bytes.size() < 4) throw Error(path + ": too short for an IDX header (" + std::to_string(bytes.size()) + " bytes)");
  if (bytes[0] != 0 || bytes[1] != 0) throw Error(path + ": bad IDX magic number (not an IDX file)");
  if (bytes[2] != kUnsignedByte) {
    throw Error(path + ": IDX element type " + std::to_string(bytes[2]) + ", only unsigned bytes (8) are supported");
  }
  const size_t ndims = bytes[3];
  if (ndims == 0 || ndims > kMaxDims) throw Error(path + ": IDX header has " + std::to_string(ndims) + " dimensions");
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) throw Error(path + ": truncated IDX header");
  IdxArray out;
  size_t count = 1;
  for (size_t i = 0; i < ndims; ++i) {
    const uint32_t d = big_endian_u32(bytes.data() + 4 + 4 * i);
    out.dims.push_back(d);
    if (d != 0 && count > kMaxIdxBytes / d) throw Error(path + ": IDX dimensions too large");
    count *= d;
  }
  const size_t have = bytes.size() - header;
  if (have != count) {
    throw Error(path + ": IDX dims " + dims_text(out.dims) + " announce " + std::to_string(count) +
                " bytes of data but the file holds " + std::to_string(have) + (have < count ? " (truncated)" : ""));
  }
  // In place: a copy would hold the file's bytes twice (47 MB for the training images).
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header));
  out.data = std::move(bytes);
  return out;
}

ByteImageDataset load_bytes(const std::string& dir, const std::string& split, size_t limit) {
  if (split != "train" && split != "t10k") {
    throw InvalidArgument("fashion_mnist::load: split '" + split + "' (expected 'train' or 't10k')");
  }
  if (!is_directory(dir)) {
    throw Error("Fashion-MNIST directory " + dir + " not found: apt install dataset-fashion-mnist");
  }
  const std::string images_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, split + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28) {
    throw Error(images_path + ": images are " + dims_text(images.dims) + ", expected N x 28 x 28");
  }
  if (labels.dims.size() != 1) throw Error(labels_path + ": labels are " + dims_text(labels.dims) + ", expected N");
  const size_t all = images.dims[0];
  if (labels.dims[0] != all) {
    throw Error(labels_path + ": " + std::to_string(labels.dims[0]) + " labels for " + std::to_string(all) +
                " images in " + images_path);
  }
  const size_t n = limit > 0 && limit < all ? limit : all;
  ByteImageDataset ds;
  ds.labels.resize(n);
  for (size_t i = 0; i < all; ++i) {  // every label is checked, also beyond the limit
    if (labels.data[i] >= kClasses) {
      throw Error(labels_path + ": label " + std::to_string(labels.data[i]) + " at index " + std::to_string(i) +
                  " is outside 0..9");
    }
    if (i < n) ds.labels[i] = labels.data[i];
  }
  images.data.resize(n * kPixels);
  images.data.shrink_to_fit();  // a limited load keeps only its own images
  ds.pixels = std::move(images.data);
  return ds;
}

ImageDataset load(const std::string& dir, const std::string& split, size_t limit) {
  ByteImageDataset bytes = load_bytes(dir, split, limit);
  ImageDataset ds;
  ds.labels = std::move(bytes.labels);
  ds.images.resize(ds.labels.size(), kPixels);
  const uint8_t* __restrict src = bytes.pixels.data();
  float* __restrict dst = ds.images.data();
  const size_t total = bytes.pixels.size();
  for (size_t i = 0; i < total; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;  // as torchvision ToTensor
  return ds;
}

void gather_rows(const ByteImageDataset& src, std::span<const size_t> indices, const std::array<float, 256>& table,
                 Tensor& dst) {
  for (size_t i : indices) {
    if (i >= src.size()) {
      throw InvalidArgument("gather_rows: index " + std::to_string(i) + " out of range (" +
                            std::to_string(src.size()) + " images)");
    }
  }
  // A CUDA destination gets the rows converted on the host first, then one copy.
  thread_local Tensor staging;
  Tensor& host = dst.is_cuda() ? staging : dst;
  host.resize(indices.size(), kPixels);
  for (size_t r = 0; r < indices.size(); ++r) {
    const uint8_t* __restrict p = src.pixels.data() + indices[r] * kPixels;
    float* __restrict out = host.row(r);
    for (size_t j = 0; j < kPixels; ++j) out[j] = table[p[j]];
  }
  if (dst.is_cuda()) {
    dst.resize(indices.size(), kPixels);
    dst.copy_from(host);
  }
}

}  // namespace fashion_mnist
