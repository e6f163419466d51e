// cuBLAS GEMM: agrees with the host gemm on a device; says why it skips without one.
#include <catch2/catch.hpp>

#include <string>

#include "ddp/cuda_gemm.hpp"
#include "ddp/gemm.hpp"
#include "ddp/random.hpp"
#include "ddp/types.hpp"

namespace {

ddp::Tensor random_tensor(size_t rows, size_t cols, uint64_t seed) {
  ddp::Rng rng(seed);
  ddp::Tensor t(rows, cols);
  for (float& x : t.span()) x = rng.uniform(-1, 1);
  return t;
}

}  // namespace

TEST_CASE("cuBLAS gemm matches the host gemm for every transpose", "[train][gpu]") {
  std::string why;
  if (!ddp::cuda_device_available(&why)) {
    WARN("SKIPPED: no usable CUDA device: " << why);
    return;
  }
  using ddp::Transpose;
  ddp::CublasContext cublas;
  const size_t m = 33, n = 17, k = 65;
  for (Transpose ta : {Transpose::No, Transpose::Yes}) {
    for (Transpose tb : {Transpose::No, Transpose::Yes}) {
      const ddp::Tensor a = ta == Transpose::No ? random_tensor(m, k, 1) : random_tensor(k, m, 1);
      const ddp::Tensor b = tb == Transpose::No ? random_tensor(k, n, 2) : random_tensor(n, k, 2);
      ddp::Tensor c = random_tensor(m, n, 3);
      ddp::DeviceTensor da(a.rows(), a.cols()), db(b.rows(), b.cols()), dc(m, n);
      da.upload(a);
      db.upload(b);
      dc.upload(c);
      ddp::gemm(a, ta, b, tb, c, 1.5f, 0.5f);
      cublas.gemm(da, ta, db, tb, dc, 1.5f, 0.5f);
      ddp::Tensor back;
      dc.download(back);
      REQUIRE(back.rows() == m);
      for (size_t i = 0; i < c.size(); ++i) CHECK(back[i] == Approx(c[i]).margin(1e-4));
    }
  }
  ddp::DeviceTensor wrong(3, 3);
  ddp::DeviceTensor x(2, 2), y(2, 2);
  CHECK_THROWS_AS(cublas.gemm(x, Transpose::No, y, Transpose::No, wrong), ddp::InvalidArgument);
}

TEST_CASE("without a usable CUDA device the GPU GEMM refuses with the reason", "[train][gpu_fallback]") {
  std::string why;
  if (ddp::cuda_device_available(&why)) {
    SUCCEED("a CUDA device is available; the [gpu] test covers it");
    return;
  }
  CHECK_FALSE(why.empty());
  CHECK_THROWS_AS(ddp::CublasContext(), ddp::Error);
}
