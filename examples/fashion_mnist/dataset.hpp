// The example's data: Fashion-MNIST from its IDX files (Debian package
// dataset-fashion-mnist).
//
// The package installs gzip-compressed IDX files in kDataDir:
//   train-images-idx3-ubyte.gz (60000 × 28 × 28), train-labels-idx1-ubyte.gz,
//   t10k-images-idx3-ubyte.gz (10000 × 28 × 28),  t10k-labels-idx1-ubyte.gz.
// Uncompressed files (the same names without .gz) are read too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/tensor.hpp"

namespace fashion_mnist {

inline constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";
inline constexpr size_t kPixels = 28 * 28;
inline constexpr int kClasses = 10;

// The contents of one IDX file of unsigned bytes (element type 0x08).
struct IdxArray {
  std::vector<uint32_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;   // product(dims) bytes, row-major
};

// Reads an IDX file of unsigned bytes, gzip-compressed or not. Throws ddp::Error
// naming the file when it cannot be opened, is not valid gzip, has a bad magic
// number or element type, or holds fewer or more bytes than its dims announce.
IdxArray read_idx(const std::string& path);

// A labelled image set.
struct ImageDataset {
  ddp::Tensor images;           // N × 784, pixel values scaled to [0, 1]
  std::vector<int32_t> labels;  // N class indices in [0, 10)
  size_t size() const { return labels.size(); }
};

// Loads split "train" (60000 images) or "t10k" (10000) from dir. Throws ddp::Error
// when dir does not exist (the message says: apt install dataset-fashion-mnist),
// when a file is missing or malformed (named in the message), when images are not
// 28 × 28, counts of images and labels differ, or a label is outside 0..9; throws
// ddp::InvalidArgument for another split name. limit > 0 keeps only the first `limit`
// images (all when the split has fewer): only those become floats, so a run on a
// subset never holds the whole split as f32 (60000 images are 188 MB).
ImageDataset load(const std::string& dir = kDataDir, const std::string& split = "train", size_t limit = 0);

// The same images kept as their bytes (a quarter of the memory of f32), for programs
// that convert each batch as they take it (gather_rows below).
struct ByteImageDataset {
  std::vector<uint8_t> pixels;  // N × 784 pixel values 0..255, row-major
  std::vector<int32_t> labels;  // N class indices in [0, 10)
  size_t size() const { return labels.size(); }
};

// load's split as bytes: the same checks, the same limit.
ByteImageDataset load_bytes(const std::string& dir = kDataDir, const std::string& split = "train",
                            size_t limit = 0);

// dst = rows `indices` of src (784 columns), pixel value p written as table[p]: the
// table holds what each byte stands for (e.g. p / 255, normalised), so a batch gets the
// same floats as a whole converted dataset would hold (a CUDA dst gets them through a
// host copy). Throws ddp::InvalidArgument for an index out of range.
void gather_rows(const ByteImageDataset& src, std::span<const size_t> indices, const std::array<float, 256>& table,
                 ddp::Tensor& dst);

}  // namespace fashion_mnist
