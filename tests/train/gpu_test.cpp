// The training core on Device::Cuda against the same computation on the host.
//
// The [gpu] cases need a CUDA device and say why they skip without one (CTest then
// reports them as skipped). The last case runs everywhere: without a device,
// asking for Device::Cuda fails with the reason instead of crashing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ddp/gemm.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"
#include "ddp/random.hpp"
#include "ddp/tensor.hpp"
#include "ddp/types.hpp"

namespace {

using ddp::Device;

ddp::Tensor random_tensor(size_t rows, size_t cols, uint64_t seed) {
  ddp::Rng rng(seed);
  ddp::Tensor t(rows, cols);
  for (float& x : t.span()) x = rng.uniform(-1, 1);
  return t;
}

bool have_gpu() {
  std::string why;
  if (ddp::cuda_device_available(&why)) return true;
  WARN("SKIPPED: no usable CUDA device: " << why);
  return false;
}

// Largest |a - b| over two tensors of one shape, the device one copied back.
float max_diff(const ddp::Tensor& host, const ddp::Tensor& device) {
  REQUIRE(device.is_cuda());
  const ddp::Tensor back = device.to(Device::Cpu);
  REQUIRE(back.rows() == host.rows());
  REQUIRE(back.cols() == host.cols());
  float worst = 0;
  for (size_t i = 0; i < host.size(); ++i) worst = std::max(worst, std::abs(back[i] - host[i]));
  return worst;
}

std::vector<int32_t> labels_for(size_t rows, size_t classes, uint64_t seed) {
  ddp::Rng rng(seed);
  std::vector<int32_t> y(rows);
  for (auto& v : y) v = static_cast<int32_t>(rng.uniform(0, static_cast<float>(classes) - 0.01f));
  return y;
}

}  // namespace

TEST_CASE("CUDA tensors copy, fill, scale and accumulate like host tensors", "[train][gpu]") {
  if (!have_gpu()) return;
  const ddp::Tensor a = random_tensor(7, 33, 1);
  ddp::Tensor d = a.to(Device::Cuda);
  CHECK(d.is_cuda());
  CHECK(max_diff(a, d) == 0.0f);
  CHECK_THROWS_AS(d.span(), ddp::InvalidArgument);

  ddp::Tensor copy = d;  // deep copy on the same device
  CHECK(copy.is_cuda());
  copy.scale(2.0f);
  copy.add_scaled(d, -1.0f);  // 2a - a
  CHECK(max_diff(a, copy) == 0.0f);
  copy.fill(3.5f);
  ddp::Tensor threes(7, 33);
  threes.fill(3.5f);
  CHECK(max_diff(threes, copy) == 0.0f);
  copy.zero();
  CHECK(max_diff(ddp::Tensor(7, 33), copy) == 0.0f);
  CHECK_THROWS_AS(copy.add_scaled(a, 1.0f), ddp::InvalidArgument);  // mixed devices

  // gather_rows from host data into a device batch.
  const std::vector<size_t> idx{6, 0, 3};
  ddp::Tensor host_rows, device_rows(0, 0, Device::Cuda);
  ddp::gather_rows(a, idx, host_rows);
  ddp::gather_rows(a, idx, device_rows);
  CHECK(max_diff(host_rows, device_rows) == 0.0f);
}

TEST_CASE("cuBLAS gemm matches the host gemm for every transpose", "[train][gpu]") {
  if (!have_gpu()) return;
  using ddp::Transpose;
  const size_t m = 33, n = 17, k = 65;
  for (Transpose ta : {Transpose::No, Transpose::Yes}) {
    for (Transpose tb : {Transpose::No, Transpose::Yes}) {
      const ddp::Tensor a = ta == Transpose::No ? random_tensor(m, k, 1) : random_tensor(k, m, 1);
      const ddp::Tensor b = tb == Transpose::No ? random_tensor(k, n, 2) : random_tensor(n, k, 2);
      ddp::Tensor c = random_tensor(m, n, 3);
      const ddp::Tensor da = a.to(Device::Cuda), db = b.to(Device::Cuda);
      ddp::Tensor dc = c.to(Device::Cuda);
      ddp::gemm(a, ta, b, tb, c, 1.5f, 0.5f);
      ddp::gemm(da, ta, db, tb, dc, 1.5f, 0.5f);
      CHECK(max_diff(c, dc) < 1e-4f);
    }
  }
  ddp::Tensor wrong(3, 3, Device::Cuda);
  const ddp::Tensor x(2, 2, Device::Cuda), y(2, 2, Device::Cuda), host(2, 2);
  CHECK_THROWS_AS(ddp::gemm(x, Transpose::No, y, Transpose::No, wrong), ddp::InvalidArgument);
  ddp::Tensor out(2, 2, Device::Cuda);
  CHECK_THROWS_AS(ddp::gemm(x, Transpose::No, host, Transpose::No, out), ddp::InvalidArgument);
}

TEST_CASE("an MLP trains on the GPU as it does on the host", "[train][gpu]") {
  if (!have_gpu()) return;
  // Two copies of one model: identical initial values, one moved to the GPU.
  auto host_model = ddp::make_mlp({.sizes = {20, 16, 8, 5}, .seed = 7});
  auto gpu_model = ddp::make_mlp({.sizes = {20, 16, 8, 5}, .seed = 7});
  gpu_model->to(Device::Cuda);
  CHECK_THROWS_AS(gpu_model->forward(random_tensor(4, 20, 1)), ddp::InvalidArgument);  // host input

  SECTION("forward, loss, backward and accuracy") {
    const ddp::Tensor x = random_tensor(12, 20, 2);
    const auto y = labels_for(12, 5, 3);
    ddp::Tensor dl_host, dl_gpu(0, 0, Device::Cuda);
    const ddp::Tensor& out_host = host_model->forward(x);
    const ddp::Tensor xd = x.to(Device::Cuda);  // layers keep a pointer to their input until backward
    const ddp::Tensor& out_gpu = gpu_model->forward(xd);
    CHECK(max_diff(out_host, out_gpu) < 1e-5f);
    const float loss_host = ddp::softmax_cross_entropy(out_host, y, dl_host);
    const float loss_gpu = ddp::softmax_cross_entropy(out_gpu, y, dl_gpu);
    CHECK(loss_gpu == Approx(loss_host).epsilon(1e-5));
    CHECK(max_diff(dl_host, dl_gpu) < 1e-6f);
    CHECK(ddp::count_correct(out_gpu, y) == ddp::count_correct(out_host, y));
    std::vector<int32_t> bad = y;
    bad[0] = 5;
    CHECK_THROWS_AS(ddp::softmax_cross_entropy(out_gpu, bad, dl_gpu), ddp::InvalidArgument);

    host_model->backward(dl_host);
    gpu_model->backward(dl_gpu);
    const auto hp = host_model->parameters(), gp = gpu_model->parameters();
    for (size_t i = 0; i < hp.size(); ++i) {
      INFO(hp[i]->name);
      CHECK(max_diff(hp[i]->grad, gp[i]->grad) < 1e-5f);
    }
  }

  SECTION("AdamW and SGD with momentum take the same steps") {
    for (const bool adamw : {true, false}) {
      auto h = ddp::make_mlp({.sizes = {20, 16, 5}, .seed = 11});
      auto g = ddp::make_mlp({.sizes = {20, 16, 5}, .seed = 11});
      g->to(Device::Cuda);
      std::unique_ptr<ddp::Optimizer> oh, og;
      if (adamw) {
        oh = std::make_unique<ddp::AdamW>(h->parameters(), ddp::AdamWOptions{.lr = 0.01f});
        og = std::make_unique<ddp::AdamW>(g->parameters(), ddp::AdamWOptions{.lr = 0.01f});
      } else {
        oh = std::make_unique<ddp::SGD>(h->parameters(), ddp::SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f});
        og = std::make_unique<ddp::SGD>(g->parameters(), ddp::SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f});
      }
      ddp::Tensor dh, dg(0, 0, Device::Cuda);
      for (int step = 0; step < 5; ++step) {
        const ddp::Tensor x = random_tensor(8, 20, 100 + static_cast<uint64_t>(step));
        const auto y = labels_for(8, 5, 200 + static_cast<uint64_t>(step));
        oh->zero_grad();
        og->zero_grad();
        ddp::softmax_cross_entropy(h->forward(x), y, dh);
        const ddp::Tensor xd = x.to(Device::Cuda);  // alive until backward, as forward requires
        ddp::softmax_cross_entropy(g->forward(xd), y, dg);
        h->backward(dh);
        g->backward(dg);
        oh->step();
        og->step();
      }
      const auto hp = h->parameters(), gp = g->parameters();
      for (size_t i = 0; i < hp.size(); ++i) {
        INFO((adamw ? "adamw " : "sgd ") << hp[i]->name);
        CHECK(max_diff(hp[i]->value, gp[i]->value) < 1e-5f);
      }
    }
  }
}

TEST_CASE("without a usable CUDA device, Device::Cuda fails with the reason", "[train][gpu_fallback]") {
  std::string why;
  if (ddp::cuda_device_available(&why)) {
    SUCCEED("a CUDA device is available; the [gpu] cases cover it");
    return;
  }
  CHECK_FALSE(why.empty());
  CHECK_THROWS_AS(ddp::Tensor(2, 2, Device::Cuda), ddp::Error);
  auto model = ddp::make_mlp({.sizes = {4, 3}, .seed = 1});
  CHECK_THROWS_AS(model->to(Device::Cuda), ddp::Error);
  // The host model is still whole and usable after the failed move.
  CHECK(model->forward(random_tensor(2, 4, 1)).rows() == 2);
}
