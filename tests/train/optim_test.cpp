// SGD and AdamW against PyTorch's update formulas, their saved state, and the
// learning-rate schedule.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <sstream>
#include <vector>

#include "ddp/lr_schedule.hpp"
#include "ddp/optim.hpp"
#include "ddp/types.hpp"

namespace {

// One parameter [1, -2, 0.5] and three steps of fixed gradients.
const std::vector<std::vector<float>> kGrads = {{0.5f, -1.0f, 2.0f}, {0.25f, 0.5f, -1.0f}, {-0.75f, 1.5f, 0.0f}};

void init(ddp::Parameter& p) {
  p.value[0] = 1.0f;
  p.value[1] = -2.0f;
  p.value[2] = 0.5f;
}

void set_grad(ddp::Parameter& p, const std::vector<float>& g) {
  for (size_t i = 0; i < g.size(); ++i) p.grad[i] = g[i];
}

std::vector<float> run(ddp::Optimizer& opt, ddp::Parameter& p) {
  for (const auto& g : kGrads) {
    set_grad(p, g);
    opt.step();
  }
  return {p.value[0], p.value[1], p.value[2]};
}

}  // namespace

TEST_CASE("plain SGD takes p -= lr * (g + wd * p)", "[train][optim]") {
  ddp::Parameter p("w", 1, 3);
  init(p);
  ddp::SGD sgd({&p}, {.lr = 0.1f});
  // torch.optim.SGD(lr=0.1) on the same gradients: [1.0, -2.1, 0.4]
  const auto v = run(sgd, p);
  CHECK(v[0] == Approx(1.0f));
  CHECK(v[1] == Approx(-2.1f));
  CHECK(v[2] == Approx(0.4f));
  CHECK(sgd.steps() == 3);

  ddp::Parameter q("w", 1, 1);
  q.value[0] = 1.0f;
  q.grad[0] = 0.5f;
  ddp::SGD decay({&q}, {.lr = 0.1f, .weight_decay = 0.1f});
  decay.step();
  CHECK(q.value[0] == Approx(1.0f - 0.1f * (0.5f + 0.1f * 1.0f)));  // 0.94
}

TEST_CASE("SGD with momentum and weight decay follows torch.optim.SGD", "[train][optim]") {
  // By hand, constant gradient 1, lr 0.1, momentum 0.9, p0 = 0:
  // b = 1, 1.9, 2.71 and p = -0.1, -0.29, -0.561.
  ddp::Parameter c("c", 1, 1);
  ddp::SGD hand({&c}, {.lr = 0.1f, .momentum = 0.9f});
  const double expect[] = {-0.1, -0.29, -0.561};
  for (double e : expect) {
    c.grad[0] = 1.0f;
    hand.step();
    CHECK(c.value[0] == Approx(e));
  }
  CHECK(hand.momentum_buffer(0)[0] == Approx(2.71));

  ddp::Parameter p("w", 1, 3);
  init(p);
  ddp::SGD sgd({&p}, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
  // torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01):
  const auto v = run(sgd, p);
  CHECK(v[0] == Approx(0.8866097331047058));
  CHECK(v[1] == Approx(-1.9631195068359375));
  CHECK(v[2] == Approx(0.14585717022418976));
}

TEST_CASE("AdamW follows torch.optim.AdamW", "[train][optim]") {
  SECTION("first step by hand") {
    // p = 1, g = 0.5, lr 0.1, wd 0.01: p *= 1 - 0.001; m = 0.05, v = 0.00025;
    // step size lr / (1 - 0.9) = 1; denom = sqrt(v) / sqrt(1 - 0.999) + eps = 0.5;
    // p = 0.999 - 1 * 0.05 / 0.5 = 0.899.
    ddp::Parameter q("q", 1, 1);
    q.value[0] = 1.0f;
    q.grad[0] = 0.5f;
    ddp::AdamW adamw({&q}, {.lr = 0.1f});
    adamw.step();
    CHECK(q.value[0] == Approx(0.899));
    CHECK(adamw.exp_avg(0)[0] == Approx(0.05));
    CHECK(adamw.exp_avg_sq(0)[0] == Approx(0.00025).epsilon(1e-4));  // 1 - 0.999f is inexact in float
  }
  SECTION("three steps, default betas") {
    ddp::Parameter p("w", 1, 3);
    init(p);
    ddp::AdamW adamw({&p}, {.lr = 0.1f});  // weight_decay 0.01 by default, as torch
    const auto v = run(adamw, p);
    CHECK(v[0] == Approx(0.8122758269309998));
    CHECK(v[1] == Approx(-1.9065378904342651));
    CHECK(v[2] == Approx(0.35150641202926636));
  }
  SECTION("three steps, other betas, eps and decay") {
    ddp::Parameter p("w", 1, 3);
    init(p);
    ddp::AdamW adamw({&p}, {.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.1f});
    const auto v = run(adamw, p);
    CHECK(v[0] == Approx(0.9796252250671387));
    CHECK(v[1] == Approx(-1.9866892099380493));
    CHECK(v[2] == Approx(0.48488229513168335));
  }
}

TEST_CASE("optimizers reject bad options", "[train][optim]") {
  ddp::Parameter p("w", 1, 1);
  CHECK_THROWS_AS(ddp::SGD({&p}, {.lr = -1.0f}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::SGD({&p}, {.lr = 0.1f, .momentum = -0.5f}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::AdamW({&p}, {.beta1 = 1.0f}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::SGD({nullptr}, {}), ddp::InvalidArgument);
}

TEST_CASE("optimizer state round-trips and resumes identically", "[train][optim][state]") {
  auto resume_matches = [](auto make) {
    ddp::Parameter a("w", 2, 2), b("w", 2, 2);
    a.value.fill(0.5f);
    auto opt_a = make(a);
    for (int s = 0; s < 2; ++s) {
      a.grad.fill(0.1f * static_cast<float>(s + 1));
      opt_a.step();
    }
    std::stringstream state;
    opt_a.save_state(state);
    b.value.copy_from(a.value);
    auto opt_b = make(b);
    opt_b.load_state(state);
    CHECK(opt_b.steps() == 2);
    for (int s = 0; s < 3; ++s) {
      a.grad.fill(-0.2f * static_cast<float>(s));
      b.grad.fill(-0.2f * static_cast<float>(s));
      opt_a.step();
      opt_b.step();
    }
    for (size_t i = 0; i < 4; ++i) CHECK(a.value[i] == b.value[i]);
  };
  resume_matches([](ddp::Parameter& p) { return ddp::SGD({&p}, {.lr = 0.1f, .momentum = 0.9f}); });
  resume_matches([](ddp::Parameter& p) { return ddp::AdamW({&p}, {.lr = 0.01f}); });
}

TEST_CASE("loading mismatched or truncated optimizer state throws and changes nothing", "[train][optim][state]") {
  ddp::Parameter p("w", 2, 2), q("v", 3, 1);
  ddp::AdamW adamw({&p}, {});
  p.grad.fill(1.0f);
  adamw.step();
  std::stringstream adam_state;
  adamw.save_state(adam_state);

  ddp::SGD sgd({&p}, {.lr = 0.1f, .momentum = 0.9f});
  adam_state.seekg(0);
  CHECK_THROWS_WITH(sgd.load_state(adam_state), Catch::Contains("adamw"));
  CHECK(sgd.steps() == 0);

  ddp::AdamW two({&p, &q}, {});
  adam_state.clear();
  adam_state.seekg(0);
  CHECK_THROWS_WITH(two.load_state(adam_state), Catch::Contains("1 parameters"));

  ddp::AdamW other_shape({&q}, {});
  adam_state.clear();
  adam_state.seekg(0);
  CHECK_THROWS_AS(other_shape.load_state(adam_state), ddp::Error);

  const std::string full = adam_state.str();
  ddp::AdamW fresh({&p}, {});
  std::stringstream truncated(full.substr(0, full.size() - 5));
  CHECK_THROWS_WITH(fresh.load_state(truncated), Catch::Contains("truncated"));
  CHECK(fresh.steps() == 0);
  CHECK(fresh.exp_avg(0)[0] == 0.0f);
}

// ---------------------------------------------------------------------------
// Learning-rate schedule
// ---------------------------------------------------------------------------

TEST_CASE("warmup then cosine decay", "[train][lr]") {
  ddp::WarmupCosine s({.base_lr = 0.4, .warmup_steps = 4, .total_steps = 104, .min_lr = 0.01});
  CHECK(s.lr_at(0) == Approx(0.1));
  CHECK(s.lr_at(1) == Approx(0.2));
  CHECK(s.lr_at(3) == Approx(0.4));
  CHECK(s.lr_at(4) == Approx(0.4));                 // start of decay: the peak
  CHECK(s.lr_at(54) == Approx((0.4 + 0.01) / 2));   // halfway: the midpoint
  CHECK(s.lr_at(29) == Approx(0.01 + 0.39 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))));
  CHECK(s.lr_at(104) == Approx(0.01));
  CHECK(s.lr_at(1000) == Approx(0.01));
  CHECK(s.lr_at(-5) == Approx(0.1));
  for (int64_t t = 4; t < 104; ++t) CHECK(s.lr_at(t + 1) <= s.lr_at(t));

  ddp::WarmupCosine no_warmup({.base_lr = 1.0, .warmup_steps = 0, .total_steps = 10, .min_lr = 0.0});
  CHECK(no_warmup.lr_at(0) == Approx(1.0));
  CHECK(no_warmup.lr_at(5) == Approx(0.5));
  CHECK(no_warmup.lr_at(10) == Approx(0.0).margin(1e-12));

  CHECK_THROWS_AS(ddp::WarmupCosine({.base_lr = 1.0, .warmup_steps = 11, .total_steps = 10}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::WarmupCosine({.base_lr = 1.0, .total_steps = 0}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::WarmupCosine({.base_lr = 0.1, .total_steps = 10, .min_lr = 0.2}), ddp::InvalidArgument);
}

TEST_CASE("linear scaling rule", "[train][lr]") {
  CHECK(ddp::scaled_lr(0.1, 1) == Approx(0.1));
  CHECK(ddp::scaled_lr(0.1, 8) == Approx(0.8));
  CHECK(ddp::scaled_lr(0.1, int64_t{512}, int64_t{256}) == Approx(0.2));
  CHECK(ddp::scaled_lr(0.1, int64_t{64}, int64_t{256}) == Approx(0.025));
  CHECK_THROWS_AS(ddp::scaled_lr(0.1, 0), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::scaled_lr(0.1, int64_t{0}, int64_t{256}), ddp::InvalidArgument);
}

namespace {

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

// The bytes checkpoints hold: pinned to what save_state wrote before the state became
// values (OptimizerState), so files written by earlier builds keep loading.
TEST_CASE("optimizer state bytes stay the checkpoint format of earlier builds", "[train][optim][state]") {
  ddp::Parameter a("w", 2, 3), b("b", 1, 3), c("c", 1, 2);
  a.value.fill(0.5f);
  b.value.fill(-0.25f);
  c.value.fill(1.0f);
  auto bytes = [](const ddp::Optimizer& o) {
    std::stringstream s;
    o.save_state(s);
    return s.str();
  };
  ddp::SGD sgd({&a, &b, &c}, {.lr = 0.1f, .momentum = 0.9f});
  a.grad.fill(0.1f);
  b.grad.fill(0.2f);
  sgd.step();
  CHECK(bytes(sgd).size() == 118);
  CHECK(fnv1a(bytes(sgd)) == 0xe3f332356b718c94ull);
  ddp::SGD fresh({&a, &b, &c}, {.lr = 0.1f, .momentum = 0.9f});  // no momentum buffers yet
  CHECK(fnv1a(bytes(fresh)) == 0xcfe8a4dfd6912b83ull);
  ddp::AdamW adam({&a, &b, &c}, {.lr = 0.01f});
  a.grad.fill(0.3f);
  b.grad.fill(-0.1f);
  c.grad.fill(0.05f);
  adam.step();
  adam.step();
  CHECK(bytes(adam).size() == 209);
  CHECK(fnv1a(bytes(adam)) == 0x542c482be1ecbb34ull);
}

TEST_CASE("optimizer state as values: views out, copies in, all or nothing", "[train][optim][state]") {
  ddp::Parameter a("w", 2, 2), b("w", 2, 2);
  a.value.fill(0.5f);
  b.value.fill(0.5f);
  ddp::AdamW one({&a}, {.lr = 0.01f});
  a.grad.fill(0.1f);
  one.step();
  const ddp::OptimizerState st = one.state();
  REQUIRE(st.kind == "adamw");
  CHECK(st.steps == 1);
  REQUIRE(st.buffers.size() == 2);
  CHECK(st.buffers[0][0].is_view());
  CHECK(one.state_bytes() == 2 * 4 * sizeof(float));

  ddp::AdamW two({&b}, {.lr = 0.01f});
  two.set_state(st);
  CHECK(two.steps() == 1);
  CHECK_FALSE(two.exp_avg(0).is_view());  // copied in: independent of `one`
  CHECK(two.exp_avg(0)[0] == one.exp_avg(0)[0]);

  ddp::OptimizerState wrong = two.state();
  wrong.buffers[1][0] = ddp::Tensor(3, 1);
  CHECK_THROWS_WITH(two.set_state(wrong), Catch::Contains("another shape"));
  CHECK(two.exp_avg_sq(0).rows() == 2);  // unchanged
  wrong = two.state();
  wrong.kind = "sgd";
  CHECK_THROWS_WITH(two.set_state(wrong), Catch::Contains("is for 'sgd'"));

  ddp::SGD sgd({&a}, {.lr = 0.1f, .momentum = 0.9f});
  CHECK(sgd.state_bytes() == 0);  // no momentum buffer before the first step
  sgd.step();
  CHECK(sgd.state_bytes() == 4 * sizeof(float));
}
