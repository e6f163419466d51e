// Tensors, GEMM, layers and the loss: shapes, views, and gradients checked against
// central finite differences of a double-precision reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "ddp/gemm.hpp"
#include "ddp/nn.hpp"
#include "ddp/tensor.hpp"
#include "ddp/types.hpp"

namespace {

ddp::Tensor random_tensor(size_t rows, size_t cols, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  ddp::Rng rng(seed);
  ddp::Tensor t(rows, cols);
  for (float& x : t.span()) x = rng.uniform(lo, hi);
  return t;
}

// Loss of `model` on (x, labels), recomputed in double from the float parameters
// with naive loops: Linear / ReLU only, like make_mlp builds.
double reference_loss(ddp::Sequential& model, const ddp::Tensor& x, const std::vector<int32_t>& labels) {
  const size_t batch = x.rows();
  std::vector<std::vector<double>> h(batch);
  for (size_t r = 0; r < batch; ++r) h[r].assign(x.row(r), x.row(r) + x.cols());
  for (size_t i = 0; i < model.size(); ++i) {
    if (auto* lin = dynamic_cast<ddp::Linear*>(&model[i])) {
      const ddp::Tensor& w = lin->weight().value;
      const ddp::Tensor& b = lin->bias().value;
      for (size_t r = 0; r < batch; ++r) {
        std::vector<double> y(w.rows());
        for (size_t o = 0; o < w.rows(); ++o) {
          double s = b.empty() ? 0.0 : b[o];
          for (size_t k = 0; k < w.cols(); ++k) s += static_cast<double>(w(o, k)) * h[r][k];
          y[o] = s;
        }
        h[r] = std::move(y);
      }
    } else {
      for (auto& row : h) {
        for (double& v : row) v = v > 0 ? v : 0;
      }
    }
  }
  double total = 0;
  for (size_t r = 0; r < batch; ++r) {
    double mx = h[r][0];
    for (double v : h[r]) mx = std::max(mx, v);
    double s = 0;
    for (double v : h[r]) s += std::exp(v - mx);
    total += mx + std::log(s) - h[r][labels[r]];
  }
  return total / static_cast<double>(batch);
}

}  // namespace

// ---------------------------------------------------------------------------
// Tensor and Parameter
// ---------------------------------------------------------------------------

TEST_CASE("an owning tensor starts zeroed and copies deeply", "[train][tensor]") {
  ddp::Tensor t(2, 3);
  CHECK(t.rows() == 2);
  CHECK(t.cols() == 3);
  CHECK(t.size() == 6);
  CHECK_FALSE(t.is_view());
  for (float x : t.span()) CHECK(x == 0.0f);
  t.fill(2.5f);
  t(1, 2) = 7.0f;
  ddp::Tensor c = t;
  c(0, 0) = -1.0f;
  CHECK(t(0, 0) == 2.5f);
  CHECK(c(1, 2) == 7.0f);
  CHECK(c.data() != t.data());
  t.zero();
  CHECK(t[5] == 0.0f);
}

TEST_CASE("a view reads and writes the memory it views", "[train][tensor]") {
  std::vector<float> mem(8, 1.0f);
  ddp::Tensor v = ddp::Tensor::view(mem.data() + 2, 2, 2);
  CHECK(v.is_view());
  CHECK(v.data() == mem.data() + 2);
  v.fill(3.0f);
  CHECK(mem == std::vector<float>{1, 1, 3, 3, 3, 3, 1, 1});
  ddp::Tensor src(2, 2);
  src.fill(4.0f);
  v = src;  // assignment into a view copies values, keeps the memory
  CHECK(v.data() == mem.data() + 2);
  CHECK(mem[5] == 4.0f);
  ddp::Tensor deep = v;  // copying a view makes an owning tensor
  CHECK_FALSE(deep.is_view());
  deep.fill(0.0f);
  CHECK(mem[2] == 4.0f);
  v.resize(1, 4);  // same element count: allowed
  CHECK(v.rows() == 1);
  CHECK_THROWS_AS(v.resize(3, 3), ddp::InvalidArgument);
  ddp::Tensor wrong(3, 1);
  CHECK_THROWS_AS(v = wrong, ddp::InvalidArgument);
}

TEST_CASE("resize within capacity keeps the memory", "[train][tensor]") {
  ddp::Tensor t(64, 10);
  const float* before = t.data();
  t.resize(17, 10);
  CHECK(t.data() == before);
  t.resize(64, 10);
  CHECK(t.data() == before);
  CHECK(t.rows() == 64);
}

TEST_CASE("gather_rows picks rows in order and rejects bad indices", "[train][tensor]") {
  ddp::Tensor src(4, 2);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  ddp::Tensor dst;
  std::vector<size_t> idx = {3, 0, 3};
  ddp::gather_rows(src, idx, dst);
  REQUIRE(dst.rows() == 3);
  CHECK(dst(0, 0) == 6.0f);
  CHECK(dst(0, 1) == 7.0f);
  CHECK(dst(1, 1) == 1.0f);
  CHECK(dst(2, 0) == 6.0f);
  std::vector<size_t> bad = {4};
  CHECK_THROWS_AS(ddp::gather_rows(src, bad, dst), ddp::InvalidArgument);
}

TEST_CASE("bind_grad moves a parameter's gradient into outside memory", "[train][tensor]") {
  ddp::Parameter p("w", 2, 3);
  p.grad.fill(1.5f);
  std::vector<float> bucket(10, 0.0f);
  p.bind_grad(bucket.data() + 4);
  CHECK(p.grad.is_view());
  CHECK(p.grad.rows() == 2);
  CHECK(p.grad.cols() == 3);
  CHECK(bucket[3] == 0.0f);
  CHECK(bucket[4] == 1.5f);
  CHECK(bucket[9] == 1.5f);
  p.grad(0, 0) = 9.0f;
  CHECK(bucket[4] == 9.0f);
  p.bind_grad(nullptr);
  CHECK_FALSE(p.grad.is_view());
  CHECK(p.grad(0, 0) == 9.0f);
  p.grad.zero();
  CHECK(bucket[4] == 9.0f);
}

// ---------------------------------------------------------------------------
// GEMM
// ---------------------------------------------------------------------------

TEST_CASE("gemm matches a naive product for every transpose combination", "[train][gemm]") {
  using ddp::Transpose;
  const size_t m = 5, n = 7, k = 3;
  for (Transpose ta : {Transpose::No, Transpose::Yes}) {
    for (Transpose tb : {Transpose::No, Transpose::Yes}) {
      const ddp::Tensor a = ta == Transpose::No ? random_tensor(m, k, 1) : random_tensor(k, m, 1);
      const ddp::Tensor b = tb == Transpose::No ? random_tensor(k, n, 2) : random_tensor(n, k, 2);
      ddp::Tensor c = random_tensor(m, n, 3);
      const ddp::Tensor c0 = c;
      ddp::gemm(a, ta, b, tb, c, 2.0f, 0.5f);
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < n; ++j) {
          double s = 0;
          for (size_t l = 0; l < k; ++l) {
            const float av = ta == Transpose::No ? a(i, l) : a(l, i);
            const float bv = tb == Transpose::No ? b(l, j) : b(j, l);
            s += static_cast<double>(av) * bv;
          }
          CHECK(c(i, j) == Approx(2.0 * s + 0.5 * c0(i, j)).margin(1e-5));
        }
      }
    }
  }
  ddp::Tensor a(2, 3), b(4, 2), c(2, 2);
  CHECK_THROWS_AS(ddp::gemm(a, Transpose::No, b, Transpose::No, c), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::set_gemm_threads(0), ddp::InvalidArgument);
}

TEST_CASE("the GEMM backend is OpenBLAS with kernels for this CPU", "[train][gemm]") {
  const std::string backend = ddp::gemm_backend();
  INFO(backend);
  CHECK_THAT(backend, Catch::StartsWith("OpenBLAS") && Catch::Contains("kernels"));
  // The loader's OPENBLAS_CORETYPE choice does not leak to child processes.
  if (backend.find("set by ddp_worker") != std::string::npos) CHECK(std::getenv("OPENBLAS_CORETYPE") == nullptr);
  // On a CPU with AVX2 the kernels are never the SSE3 fallback (unless the user chose).
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2")) {
    CHECK_THAT(backend, !Catch::Contains("kernels Prescott"));
  }
}

// ---------------------------------------------------------------------------
// Layers
// ---------------------------------------------------------------------------

TEST_CASE("Linear initialises like PyTorch, reproducibly from a seed", "[train][nn]") {
  ddp::Rng rng1(42), rng2(42), rng3(43);
  ddp::Linear a({100, 30, true}, rng1), b({100, 30, true}, rng2), c({100, 30, true}, rng3);
  const float bound = 1.0f / std::sqrt(100.0f);
  float lo = 1, hi = -1;
  double sum = 0;
  for (float w : a.weight().value.span()) {
    CHECK(std::abs(w) <= bound);
    lo = std::min(lo, w);
    hi = std::max(hi, w);
    sum += w;
  }
  CHECK(lo < -0.9f * bound);  // 3000 draws span the interval
  CHECK(hi > 0.9f * bound);
  CHECK(std::abs(sum / 3000.0) < 0.01);
  for (float x : a.bias().value.span()) CHECK(std::abs(x) <= bound);
  CHECK(a.weight().value.rows() == 30);
  CHECK(a.weight().value.cols() == 100);
  CHECK(a.bias().value.cols() == 30);
  const auto wa = a.weight().value.span(), wb = b.weight().value.span(), wc = c.weight().value.span();
  CHECK(std::equal(wa.begin(), wa.end(), wb.begin()));
  CHECK_FALSE(std::equal(wa.begin(), wa.end(), wc.begin()));
}

TEST_CASE("make_mlp names parameters like torch.nn.Sequential", "[train][nn]") {
  auto model = ddp::make_mlp({{784, 256, 128, 10}, 1});
  std::vector<std::string> names;
  for (auto* p : model->parameters()) names.push_back(p->name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"});
  CHECK(model->num_parameters() == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  CHECK(model->size() == 5);
  CHECK_THROWS_AS(ddp::make_mlp({{784}, 1}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::make_mlp({{784, 0, 10}, 1}), ddp::InvalidArgument);
}

TEST_CASE("Linear forward computes x W^T + b", "[train][nn]") {
  ddp::Rng rng(0);
  ddp::Linear lin({2, 3, true}, rng);
  float w[] = {1, 2, 3, 4, 5, 6};  // 3 x 2
  std::copy(w, w + 6, lin.weight().value.data());
  lin.bias().value[0] = 0.5f;
  lin.bias().value[1] = -1.0f;
  lin.bias().value[2] = 0.0f;
  ddp::Tensor x(2, 2);
  x(0, 0) = 1;
  x(0, 1) = -1;
  x(1, 0) = 2;
  x(1, 1) = 0.5f;
  const ddp::Tensor& y = lin.forward(x);
  REQUIRE(y.rows() == 2);
  REQUIRE(y.cols() == 3);
  CHECK(y(0, 0) == Approx(1 - 2 + 0.5));
  CHECK(y(0, 1) == Approx(3 - 4 - 1.0));
  CHECK(y(0, 2) == Approx(5 - 6));
  CHECK(y(1, 0) == Approx(2 + 1 + 0.5));
  CHECK(y(1, 2) == Approx(10 + 3));
  ddp::Tensor wrong(2, 3);
  CHECK_THROWS_AS(lin.forward(wrong), ddp::InvalidArgument);
}

TEST_CASE("cross-entropy matches its definition and is numerically stable", "[train][loss]") {
  ddp::Tensor logits(2, 3);
  float v[] = {1, 2, 3, 0.5f, -1, 4};
  std::copy(v, v + 6, logits.data());
  std::vector<int32_t> labels = {2, 0};
  ddp::Tensor d;
  const float loss = ddp::softmax_cross_entropy(logits, labels, d);
  CHECK(loss == Approx(1.9719377756118774));  // torch.nn.functional.cross_entropy
  // dlogits = (softmax - onehot) / batch: rows sum to zero.
  for (size_t r = 0; r < 2; ++r) CHECK(d(r, 0) + d(r, 1) + d(r, 2) == Approx(0.0).margin(1e-7));
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  CHECK(d(0, 0) == Approx(e1 / (e1 + e2 + e3) / 2));
  CHECK(d(0, 2) == Approx((e3 / (e1 + e2 + e3) - 1) / 2));

  ddp::Tensor big(2, 2);
  big(0, 0) = 1000;
  big(0, 1) = 0;
  big(1, 0) = 1000;
  big(1, 1) = 0;
  std::vector<int32_t> big_labels = {0, 1};
  const float big_loss = ddp::softmax_cross_entropy(big, big_labels, d);
  CHECK(std::isfinite(big_loss));
  CHECK(big_loss == Approx(500.0f));
  for (float x : d.span()) CHECK(std::isfinite(x));

  std::vector<int32_t> out_of_range = {2, 3};
  CHECK_THROWS_AS(ddp::softmax_cross_entropy(logits, out_of_range, d), ddp::InvalidArgument);
  std::vector<int32_t> too_few = {1};
  CHECK_THROWS_AS(ddp::softmax_cross_entropy(logits, too_few, d), ddp::InvalidArgument);
  CHECK(ddp::count_correct(logits, labels) == 1);
}

TEST_CASE("MLP gradients match finite differences of a double reference", "[train][nn][gradcheck]") {
  auto model = ddp::make_mlp({{6, 8, 5, 4}, 7});
  const size_t batch = 5;
  ddp::Tensor x = random_tensor(batch, 6, 99);
  std::vector<int32_t> labels = {0, 3, 1, 2, 3};

  model->zero_grad();
  const ddp::Tensor& logits = model->forward(x);
  ddp::Tensor dlogits;
  const float loss = ddp::softmax_cross_entropy(logits, labels, dlogits);
  CHECK(loss == Approx(reference_loss(*model, x, labels)).epsilon(1e-5));
  model->backward(dlogits);

  // Perturb each parameter value in float, evaluate the loss in double (so the only
  // float rounding is in the analytic gradient under test).
  const float h = 1e-3f;
  size_t checked = 0;
  for (ddp::Parameter* p : model->parameters()) {
    for (size_t i = 0; i < p->numel(); ++i) {
      const float saved = p->value[i];
      p->value[i] = saved + h;
      const float up = p->value[i];
      const double lp = reference_loss(*model, x, labels);
      p->value[i] = saved - h;
      const float down = p->value[i];
      const double lm = reference_loss(*model, x, labels);
      p->value[i] = saved;
      const double numeric = (lp - lm) / (static_cast<double>(up) - down);
      INFO(p->name << "[" << i << "] analytic " << p->grad[i] << " numeric " << numeric);
      CHECK(p->grad[i] == Approx(numeric).margin(2e-4).epsilon(1e-2));
      ++checked;
    }
  }
  CHECK(checked == model->num_parameters());
}

TEST_CASE("Linear and ReLU input gradients match finite differences", "[train][nn][gradcheck]") {
  // A model whose input gradient is asked for: Linear -> ReLU -> Linear.
  ddp::Sequential model;
  ddp::Rng rng(5);
  model.add<ddp::Linear>(ddp::LinearOptions{4, 6, true}, rng, "0.");
  model.add<ddp::ReLU>();
  model.add<ddp::Linear>(ddp::LinearOptions{6, 3, true}, rng, "2.");
  ddp::Tensor x = random_tensor(3, 4, 11);
  std::vector<int32_t> labels = {2, 0, 1};
  ddp::Tensor dlogits;
  ddp::softmax_cross_entropy(model.forward(x), labels, dlogits);
  const ddp::Tensor dx = model.backward(dlogits, {}, true);
  REQUIRE(dx.rows() == 3);
  REQUIRE(dx.cols() == 4);
  const float h = 1e-3f;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = x[i];
    const double lp = reference_loss(model, x, labels);
    x[i] = saved - h;
    const double down = x[i];
    const double lm = reference_loss(model, x, labels);
    x[i] = saved;
    CHECK(dx[i] == Approx((lp - lm) / (up - down)).margin(1e-4).epsilon(1e-2));
  }
}

TEST_CASE("backward accumulates until zero_grad", "[train][nn]") {
  auto model = ddp::make_mlp({{4, 5, 3}, 3});
  ddp::Tensor x = random_tensor(2, 4, 1);
  std::vector<int32_t> labels = {1, 2};
  ddp::Tensor dlogits;
  ddp::softmax_cross_entropy(model->forward(x), labels, dlogits);
  model->backward(dlogits);
  std::vector<float> once;
  for (auto* p : model->parameters()) once.insert(once.end(), p->grad.span().begin(), p->grad.span().end());
  ddp::softmax_cross_entropy(model->forward(x), labels, dlogits);
  model->backward(dlogits);
  size_t k = 0;
  for (auto* p : model->parameters()) {
    for (float g : p->grad.span()) CHECK(g == Approx(2 * once[k++]).margin(1e-7));
  }
  model->zero_grad();
  for (auto* p : model->parameters()) {
    for (float g : p->grad.span()) CHECK(g == 0.0f);
  }
}

// Pipelines keep several micro-batches' forwards alive: slot i's backward must use slot
// i's activations whatever ran in the other slots in between.
TEST_CASE("activation slots pair each backward with its own slot's forward", "[train][nn][slots]") {
  const std::vector<ddp::Tensor> xs = {random_tensor(3, 6, 11), random_tensor(2, 6, 12), random_tensor(4, 6, 13)};
  const std::vector<std::vector<int32_t>> labels = {{0, 3, 1}, {2, 2}, {1, 0, 3, 2}};
  // Each micro-batch alone: forward then backward, gradients accumulated.
  auto alone = ddp::make_mlp({{6, 7, 5, 4}, 5});
  std::vector<ddp::Tensor> dx_alone;
  for (size_t i = 0; i < xs.size(); ++i) {
    ddp::Tensor dlogits;
    ddp::softmax_cross_entropy(alone->forward(xs[i]), labels[i], dlogits);
    dx_alone.push_back(static_cast<ddp::Module&>(*alone).backward(dlogits, {}, true));
  }
  // All forwards first (slots 0, 1, 2), then the backwards in reverse order.
  auto slotted = ddp::make_mlp({{6, 7, 5, 4}, 5});
  std::vector<ddp::Tensor> dlogits(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    slotted->select_slot(i);
    ddp::softmax_cross_entropy(slotted->forward(xs[i]), labels[i], dlogits[i]);
  }
  for (size_t i = xs.size(); i-- > 0;) {
    slotted->select_slot(i);
    const ddp::Tensor& dx = static_cast<ddp::Module&>(*slotted).backward(dlogits[i], {}, true);
    REQUIRE(dx.rows() == dx_alone[i].rows());
    for (size_t k = 0; k < dx.size(); ++k) CHECK(dx[k] == dx_alone[i][k]);
  }
  // Same gradients up to the order of accumulation (three terms per value).
  const auto a = alone->parameters(), b = slotted->parameters();
  for (size_t p = 0; p < a.size(); ++p) {
    for (size_t k = 0; k < a[p]->numel(); ++k) CHECK(b[p]->grad[k] == Approx(a[p]->grad[k]).margin(1e-6));
  }
  // A slot that never ran forward is refused, not read.
  slotted->select_slot(7);
  CHECK_THROWS_AS(static_cast<ddp::Module&>(*slotted).backward(dlogits[0], {}, true), ddp::InvalidArgument);
}

TEST_CASE("the grad-ready hook fires once per parameter, in reverse order, with final grads", "[train][nn][hook]") {
  auto model = ddp::make_mlp({{6, 8, 5, 4}, 2});
  ddp::Tensor x = random_tensor(3, 6, 4);
  std::vector<int32_t> labels = {0, 1, 3};
  ddp::Tensor dlogits;
  ddp::softmax_cross_entropy(model->forward(x), labels, dlogits);

  // Gradients land in a flat "bucket" through bind_grad, as DDP arranges.
  const auto params = model->parameters();
  std::vector<float> bucket(model->num_parameters(), 0.0f);
  size_t offset = 0;
  for (auto* p : params) {
    p->bind_grad(bucket.data() + offset);
    offset += p->numel();
  }

  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> at_hook;
  model->backward(dlogits, [&](ddp::Parameter& p) {
    order.push_back(p.name);
    at_hook[p.name].assign(p.grad.span().begin(), p.grad.span().end());
  });
  CHECK(order == std::vector<std::string>{"4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"});
  offset = 0;
  for (auto* p : params) {
    const auto& seen = at_hook[p->name];
    REQUIRE(seen.size() == p->numel());
    for (size_t i = 0; i < p->numel(); ++i) {
      CHECK(seen[i] == p->grad[i]);               // final when the hook ran
      CHECK(bucket[offset + i] == p->grad[i]);    // written into the bucket
    }
    offset += p->numel();
  }
  // The gradients equal those of an unbound copy of the model.
  auto twin = ddp::make_mlp({{6, 8, 5, 4}, 2});
  ddp::Tensor d2;
  ddp::softmax_cross_entropy(twin->forward(x), labels, d2);
  twin->backward(d2);
  const auto tp = twin->parameters();
  for (size_t j = 0; j < params.size(); ++j) {
    for (size_t i = 0; i < params[j]->numel(); ++i) CHECK(params[j]->grad[i] == tp[j]->grad[i]);
  }
}

TEST_CASE("a model reuses its buffers across batch sizes", "[train][nn]") {
  auto model = ddp::make_mlp({{5, 7, 3}, 8});
  ddp::Tensor x = random_tensor(4, 5, 2);
  const ddp::Tensor full = model->forward(x);  // copy
  ddp::Tensor one;
  std::vector<size_t> idx = {2};
  ddp::gather_rows(x, idx, one);
  const ddp::Tensor& y = model->forward(one);
  REQUIRE(y.rows() == 1);
  for (size_t j = 0; j < 3; ++j) CHECK(y(0, j) == Approx(full(2, j)).margin(1e-6));
  const ddp::Tensor& again = model->forward(x);
  for (size_t i = 0; i < full.size(); ++i) CHECK(again[i] == full[i]);
}

TEST_CASE("a released parameter keeps its shape, and a layer refuses it until it is bound again",
          "[train][nn][sharding]") {
  ddp::Rng rng(7);
  ddp::Linear layer({.in_features = 3, .out_features = 2}, rng, "0.");
  ddp::Tensor x(4, 3);
  x.fill(1.0f);
  const ddp::Tensor before = layer.forward(x);
  const ddp::Tensor weights = layer.weight().value;

  layer.weight().release_value();
  CHECK_FALSE(layer.weight().materialized());
  CHECK(layer.weight().value.empty());
  CHECK(layer.weight().rows() == 2);
  CHECK(layer.weight().cols() == 3);
  CHECK(layer.weight().numel() == 6);
  CHECK_THROWS_WITH(layer.forward(x), Catch::Contains("'0.weight' is not gathered"));

  std::vector<float> gathered(weights.span().begin(), weights.span().end());
  layer.weight().bind_value(gathered.data());
  CHECK(layer.weight().materialized());
  CHECK(layer.weight().value.is_view());
  const ddp::Tensor& after = layer.forward(x);
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == before[i]);

  // Bound while materialized: the values move into the new memory.
  std::vector<float> other(6, 0.0f);
  layer.weight().bind_value(other.data());
  CHECK(other[0] == weights[0]);
  CHECK(layer.weight().value.data() == other.data());
}
