// The Fashion-MNIST example's reader (examples/fashion_mnist/dataset.hpp): the real
// files from dataset-fashion-mnist, and malformed IDX and gzip files written to a
// temporary directory.
#include <catch2/catch.hpp>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dataset.hpp"
#include "ddp/types.hpp"
#include "subprocess.hpp"

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

// An IDX header of unsigned bytes with the given dims, then `data`.
Bytes idx(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = 0x08) {
  Bytes b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    b.push_back(static_cast<uint8_t>(d >> 24));
    b.push_back(static_cast<uint8_t>(d >> 16));
    b.push_back(static_cast<uint8_t>(d >> 8));
    b.push_back(static_cast<uint8_t>(d));
  }
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

void write_plain(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(out.good());
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// A small valid split of n images (pixel i of image k = k + i mod 256) and labels k % 10.
void write_split(const testing::TempDir& dir, const std::string& split, uint32_t n, bool gz = true) {
  Bytes pixels(n * 784), labels(n);
  for (uint32_t k = 0; k < n; ++k) {
    for (uint32_t i = 0; i < 784; ++i) pixels[k * 784 + i] = static_cast<uint8_t>((k + i) % 256);
    labels[k] = static_cast<uint8_t>(k % 10);
  }
  auto w = gz ? write_gz : write_plain;
  const std::string ext = gz ? ".gz" : "";
  w((dir / (split + "-images-idx3-ubyte" + ext)).string(), idx({n, 28, 28}, pixels));
  w((dir / (split + "-labels-idx1-ubyte" + ext)).string(), idx({n}, labels));
}

}  // namespace

TEST_CASE("the real Fashion-MNIST train and test splits load", "[example][data]") {
  REQUIRE(fs::is_directory(fashion_mnist::kDataDir));  // scripts/setup installs dataset-fashion-mnist
  const auto train = fashion_mnist::load(fashion_mnist::kDataDir, "train");
  REQUIRE(train.size() == 60000);
  CHECK(train.images.rows() == 60000);
  CHECK(train.images.cols() == 784);
  std::vector<int> per_class(10, 0);
  for (int32_t l : train.labels) {
    REQUIRE(l >= 0);
    REQUIRE(l <= 9);
    ++per_class[l];
  }
  CHECK(per_class == std::vector<int>(10, 6000));  // the dataset is balanced
  CHECK(std::vector<int32_t>(train.labels.begin(), train.labels.begin() + 10) ==
        std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  float lo = 1, hi = 0;
  for (float x : train.images.span()) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  double first = 0;  // image 0's raw pixels sum to 76247
  for (size_t i = 0; i < 784; ++i) first += train.images(0, i);
  CHECK(first == Approx(76247.0 / 255.0));

  const auto test = fashion_mnist::load(fashion_mnist::kDataDir, "t10k");
  REQUIRE(test.size() == 10000);
  CHECK(test.images.rows() == 10000);
  CHECK(std::vector<int32_t>(test.labels.begin(), test.labels.begin() + 10) ==
        std::vector<int32_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});

  const auto raw = fashion_mnist::read_idx(std::string(fashion_mnist::kDataDir) + "/t10k-images-idx3-ubyte.gz");
  CHECK(raw.dims == std::vector<uint32_t>{10000, 28, 28});
  CHECK(raw.data.size() == 10000u * 784u);
}

TEST_CASE("small valid splits load, gzip'ed or plain", "[example][data]") {
  testing::TempDir dir;
  write_split(dir, "train", 12, true);
  write_split(dir, "t10k", 3, false);
  const auto train = fashion_mnist::load(dir.path().string(), "train");
  REQUIRE(train.size() == 12);
  CHECK(train.labels[11] == 1);
  CHECK(train.images(2, 3) == Approx(5.0f / 255.0f));
  const auto test = fashion_mnist::load(dir.path().string(), "t10k");
  REQUIRE(test.size() == 3);
  CHECK(test.images(1, 254) == Approx(255.0f / 255.0f));
  CHECK_THROWS_AS(fashion_mnist::load(dir.path().string(), "valid"), ddp::InvalidArgument);
}

TEST_CASE("a limited load keeps the first images, converted alike", "[example][data]") {
  testing::TempDir dir;
  write_split(dir, "train", 12, true);
  const auto all = fashion_mnist::load(dir.path().string(), "train");
  const auto head = fashion_mnist::load(dir.path().string(), "train", 5);
  REQUIRE(head.size() == 5);
  REQUIRE(head.images.rows() == 5);
  CHECK(std::vector<int32_t>(head.labels.begin(), head.labels.end()) ==
        std::vector<int32_t>(all.labels.begin(), all.labels.begin() + 5));
  CHECK(std::memcmp(head.images.data(), all.images.data(), 5 * 784 * sizeof(float)) == 0);
  CHECK(fashion_mnist::load(dir.path().string(), "train", 100).size() == 12);  // more than there are: all
}

TEST_CASE("byte images gathered through a table give the floats of a converted load", "[example][data]") {
  testing::TempDir dir;
  write_split(dir, "train", 12, true);
  const auto floats = fashion_mnist::load(dir.path().string(), "train");
  const auto bytes = fashion_mnist::load_bytes(dir.path().string(), "train", 7);
  REQUIRE(bytes.size() == 7);
  REQUIRE(bytes.pixels.size() == 7 * 784);
  CHECK(std::vector<int32_t>(bytes.labels.begin(), bytes.labels.end()) ==
        std::vector<int32_t>(floats.labels.begin(), floats.labels.begin() + 7));
  std::array<float, 256> scaled{};
  for (int p = 0; p < 256; ++p) scaled[static_cast<size_t>(p)] = static_cast<float>(p) / 255.0f;
  const std::vector<size_t> rows{6, 0, 3};
  ddp::Tensor batch;
  fashion_mnist::gather_rows(bytes, rows, scaled, batch);
  REQUIRE(batch.rows() == 3);
  REQUIRE(batch.cols() == 784);
  for (size_t r = 0; r < rows.size(); ++r) {
    CHECK(std::memcmp(batch.row(r), floats.images.row(rows[r]), 784 * sizeof(float)) == 0);
  }
  const std::vector<size_t> beyond{7};
  CHECK_THROWS_AS(fashion_mnist::gather_rows(bytes, beyond, scaled, batch), ddp::InvalidArgument);
}

TEST_CASE("a missing directory or file says which and how to install it", "[example][data]") {
  CHECK_THROWS_WITH(fashion_mnist::load("/nonexistent/fashion", "train"),
                    Catch::Contains("/nonexistent/fashion") && Catch::Contains("apt install dataset-fashion-mnist"));
  testing::TempDir dir;
  CHECK_THROWS_WITH(fashion_mnist::load(dir.path().string(), "train"),
                    Catch::Contains("train-images-idx3-ubyte") && Catch::Contains("apt install"));
  CHECK_THROWS_WITH(fashion_mnist::read_idx((dir / "nothing.gz").string()), Catch::Contains("nothing.gz"));
}

TEST_CASE("malformed IDX files are rejected with the file named", "[example][data]") {
  testing::TempDir dir;
  const std::string p = (dir / "x-idx1-ubyte").string();
  auto rejects = [&](const Bytes& b, const std::string& why) {
    write_plain(p, b);
    CHECK_THROWS_WITH(fashion_mnist::read_idx(p), Catch::Contains(p) && Catch::Contains(why));
    write_gz(p + ".gz", b);
    CHECK_THROWS_WITH(fashion_mnist::read_idx(p + ".gz"), Catch::Contains(p + ".gz") && Catch::Contains(why));
  };
  rejects({}, "too short");
  rejects({0, 0, 8}, "too short");
  rejects({1, 2, 8, 1, 0, 0, 0, 1, 5}, "magic");
  rejects(idx({2}, {1, 2}, 0x0D), "element type");
  rejects({0, 0, 8, 0}, "dimensions");
  rejects({0, 0, 8, 3, 0, 0}, "truncated IDX header");
  rejects(idx({4}, {1, 2, 3}), "truncated");
  rejects(idx({2}, {1, 2, 3}), "holds 3");
  rejects(idx({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {1}), "too large");
  write_plain(p, idx({3}, {7, 8, 9}));
  const auto ok = fashion_mnist::read_idx(p);
  CHECK(ok.dims == std::vector<uint32_t>{3});
  CHECK(ok.data == Bytes{7, 8, 9});
}

TEST_CASE("corrupt and truncated gzip files are rejected", "[example][data]") {
  testing::TempDir dir;
  const std::string good = (dir / "good.gz").string();
  Bytes data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  write_gz(good, idx({5000}, data));
  const Bytes gz = read_bytes(good);
  REQUIRE(fashion_mnist::read_idx(good).data == data);

  const std::string cut = (dir / "cut.gz").string();
  write_plain(cut, Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
  CHECK_THROWS_WITH(fashion_mnist::read_idx(cut), Catch::Contains("cut.gz"));

  const std::string flipped = (dir / "flipped.gz").string();
  Bytes bad = gz;
  bad[gz.size() / 2] ^= 0xFF;
  bad[gz.size() / 2 + 1] ^= 0x55;
  write_plain(flipped, bad);
  CHECK_THROWS_WITH(fashion_mnist::read_idx(flipped), Catch::Contains("flipped.gz"));

  const std::string crc = (dir / "crc.gz").string();  // data intact, trailer CRC wrong
  Bytes bad_crc = gz;
  bad_crc[gz.size() - 6] ^= 0x01;
  write_plain(crc, bad_crc);
  CHECK_THROWS_WITH(fashion_mnist::read_idx(crc), Catch::Contains("crc.gz") && Catch::Contains("gzip"));
}

TEST_CASE("inconsistent splits are rejected", "[example][data]") {
  Bytes pixels(2 * 784, 0);
  SECTION("label count differs from image count") {
    testing::TempDir dir;
    write_gz((dir / "train-images-idx3-ubyte.gz").string(), idx({2, 28, 28}, pixels));
    write_gz((dir / "train-labels-idx1-ubyte.gz").string(), idx({3}, {1, 2, 3}));
    CHECK_THROWS_WITH(fashion_mnist::load(dir.path().string(), "train"), Catch::Contains("3 labels for 2 images"));
  }
  SECTION("label outside 0..9") {
    testing::TempDir dir;
    write_gz((dir / "train-images-idx3-ubyte.gz").string(), idx({2, 28, 28}, pixels));
    write_gz((dir / "train-labels-idx1-ubyte.gz").string(), idx({2}, {1, 10}));
    CHECK_THROWS_WITH(fashion_mnist::load(dir.path().string(), "train"),
                      Catch::Contains("label 10") && Catch::Contains("train-labels-idx1-ubyte.gz"));
  }
  SECTION("images are not 28 x 28") {
    testing::TempDir dir;
    write_gz((dir / "train-images-idx3-ubyte.gz").string(), idx({2, 28, 27}, Bytes(2 * 28 * 27, 0)));
    write_gz((dir / "train-labels-idx1-ubyte.gz").string(), idx({2}, {1, 2}));
    CHECK_THROWS_WITH(fashion_mnist::load(dir.path().string(), "train"), Catch::Contains("expected N x 28 x 28"));
  }
}
