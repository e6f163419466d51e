// ShardedOptimizer in one process: the flat layout logic (slots, padding, slot
// indices), checked against an unsharded optimizer. A group of one rank steps every
// shard itself, so its values, state and save_state bytes must equal an unsharded
// SGD/AdamW's bit for bit; load_state's slicing is checked for a rank of a larger world
// (it needs no communication). The collectives at 2 and 3 ranks are sharded_checks'.
#include <catch2/catch.hpp>
#include <cstring>
#include <sstream>

#include "ddp/fully_sharded_data_parallel.hpp"
#include "ddp/nn.hpp"
#include "ddp/random.hpp"
#include "ddp/zero_redundancy_optimizer.hpp"
#include "recording_backend.hpp"

namespace {

// A group of `size` ranks seen from `rank` that can only run collectives alone: with one
// rank they are copies (gather, all-gather) or nothing (all-reduce); with more it throws.
std::shared_ptr<ddp::ProcessGroup> lone_group(int rank, int size) {
  return testing::recording_group("lone", rank, size, ddp::detail::Reach::Host, nullptr,
                                  [](const ddp::detail::Op& op, const ddp::detail::Backend& b) {
    if (b.size() != 1) throw ddp::Error("lone group: a collective needs peers");
    const bool gathers = op.kind == ddp::detail::OpKind::Gather || op.kind == ddp::detail::OpKind::AllGather;
    if (gathers && op.input.data != op.output.data) {
      std::memmove(op.output.data, op.input.data, op.input.count * ddp::dtype_size(op.input.dtype));
    }
    return ddp::Work();
  });
}

// A model's parameters laid out in flat groups with one 1 × shard parameter per group
// holding rank `rank`'s slice of the values and grads.
struct Sharded {
  std::vector<ddp::FlatGroup> groups;
  std::vector<std::unique_ptr<ddp::Parameter>> shards;

  Sharded(const std::vector<ddp::Parameter*>& params, int world, int rank)
      : groups(ddp::bucket_groups(params, 2048, 4096, world)) {
    for (const auto& g : groups) {
      const size_t lo = static_cast<size_t>(rank) * g.shard();
      shards.push_back(std::make_unique<ddp::Parameter>("shard", 1, g.shard()));
      for (const auto& s : g.slots)
        for (size_t j = 0; j < s.param->numel(); ++j) {
          const size_t at = s.offset + j;
          if (at < lo || at >= lo + g.shard()) continue;
          shards.back()->value[at - lo] = s.param->value[j];
          shards.back()->grad[at - lo] = s.param->grad[j];
        }
    }
  }
  std::vector<ddp::Parameter*> pointers() const {
    std::vector<ddp::Parameter*> out;
    for (const auto& s : shards) out.push_back(s.get());
    return out;
  }
  // The values of the shards written back into the parameters (world 1: everything).
  void unpack() const {
    for (size_t i = 0; i < groups.size(); ++i)
      for (const auto& s : groups[i].slots)
        std::memcpy(s.param->value.data(), shards[i]->value.data() + s.offset, s.param->numel() * sizeof(float));
  }
};

void random_grads(const std::vector<ddp::Parameter*>& params, uint64_t seed) {
  ddp::Rng rng(seed);
  for (auto* p : params)
    for (float& g : p->grad.span()) g = rng.uniform(-1.0f, 1.0f);
}

std::string bytes_of(const ddp::Optimizer& opt) {
  std::ostringstream out;
  opt.save_state(out);
  return out.str();
}

const ddp::OptimizerFactory kAdamW = [](std::vector<ddp::Parameter*> p) {
  return std::make_unique<ddp::AdamW>(std::move(p), ddp::AdamWOptions{.lr = 1e-2f, .weight_decay = 0.1f});
};
const ddp::OptimizerFactory kSgd = [](std::vector<ddp::Parameter*> p) {
  return std::make_unique<ddp::SGD>(std::move(p), ddp::SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f});
};

// Steps an unsharded optimizer and a sharded one (world 1, several groups) on the same
// grads: values and saved bytes must be identical.
void matches_unsharded(const ddp::OptimizerFactory& make) {
  auto ref = ddp::make_mlp({.sizes = {13, 37, 29, 5}, .seed = 4});
  auto model = ddp::make_mlp({.sizes = {13, 37, 29, 5}, .seed = 4});
  auto plain = make(ref->parameters());
  auto pg = lone_group(0, 1);
  Sharded flat(model->parameters(), 1, 0);
  REQUIRE(flat.groups.size() > 1);  // the caps split the model
  ddp::ShardedOptimizer sharded(flat.groups, flat.pointers(), pg, make);
  CHECK(std::string(sharded.kind()) == plain->kind());
  for (int step = 0; step < 4; ++step) {
    random_grads(ref->parameters(), 10 + step);
    // Grads into the shards through the model's layout.
    for (size_t i = 0; i < flat.groups.size(); ++i)
      for (const auto& s : flat.groups[i].slots)
        std::memcpy(flat.shards[i]->grad.data() + s.offset, ref->parameters()[s.index]->grad.data(),
                    s.param->numel() * sizeof(float));
    plain->set_lr(0.01f * static_cast<float>(step + 1));  // a schedule reaches the shards
    sharded.set_lr(plain->lr());
    plain->step();
    sharded.step();
  }
  flat.unpack();
  for (size_t i = 0; i < ref->parameters().size(); ++i) {
    INFO(ref->parameters()[i]->name);
    CHECK(std::memcmp(ref->parameters()[i]->value.data(), model->parameters()[i]->value.data(),
                      ref->parameters()[i]->numel() * sizeof(float)) == 0);
  }
  CHECK(sharded.steps() == 4);
  CHECK(sharded.state_bytes() >= plain->state_bytes());  // plus padding (none at world 1)
  CHECK_THROWS_AS(bytes_of(sharded), ddp::InvalidArgument);  // not consolidated yet
  sharded.consolidate_state(0);
  const std::string want = bytes_of(*plain);
  CHECK(bytes_of(sharded) == want);

  // The same bytes load back into a fresh sharded optimizer, which saves them again.
  auto other = ddp::make_mlp({.sizes = {13, 37, 29, 5}, .seed = 9});
  Sharded flat2(other->parameters(), 1, 0);
  ddp::ShardedOptimizer loaded(flat2.groups, flat2.pointers(), pg, make);
  std::istringstream in(want);
  loaded.load_state(in);
  CHECK(loaded.steps() == 4);
  loaded.consolidate_state(0);
  CHECK(bytes_of(loaded) == want);
}

}  // namespace

TEST_CASE("a flat group's shard is its padded size split over the world", "[train][sharding]") {
  ddp::FlatGroup g;
  g.numel = 10;
  g.padded = 12;
  g.world = 3;
  CHECK(g.shard() == 4);
  ddp::MemoryStats m{.params = 1, .grads = 2, .optimizer = 3, .comm = 4, .transient_peak = 5};
  CHECK(m.held() == 6);
  ddp::FsdpStepStats s;
  CHECK(s.hidden() == 1.0);
  s.comm_busy = 2.0;
  s.comm_wait = 0.5;
  CHECK(s.hidden() == Approx(0.75));
}

TEST_CASE("ShardedOptimizer over AdamW steps and saves exactly as an unsharded AdamW", "[train][sharding]") {
  matches_unsharded(kAdamW);
}

TEST_CASE("ShardedOptimizer over SGD with momentum steps and saves exactly as an unsharded SGD", "[train][sharding]") {
  matches_unsharded(kSgd);
}

TEST_CASE("ShardedOptimizer load_state keeps this rank's slice of each parameter's state", "[train][sharding]") {
  // A saved AdamW state whose values say where they belong: parameter i, element j of
  // exp_avg holds i * 1000 + j, exp_avg_sq its negative.
  auto model = ddp::make_mlp({.sizes = {13, 37, 29, 5}, .seed = 1});
  const auto params = model->parameters();
  ddp::OptimizerState full{"adamw", 7, {{}, {}}};
  for (size_t i = 0; i < params.size(); ++i) {
    ddp::Tensor m(params[i]->rows(), params[i]->cols()), v(params[i]->rows(), params[i]->cols());
    for (size_t j = 0; j < m.size(); ++j) {
      m[j] = static_cast<float>(i * 1000 + j);
      v[j] = -m[j];
    }
    full.buffers[0].push_back(m);
    full.buffers[1].push_back(v);
  }
  std::ostringstream saved;
  ddp::write_optimizer_state(saved, full);
  for (int rank = 0; rank < 3; ++rank) {
    Sharded flat(params, 3, rank);
    ddp::ShardedOptimizer opt(flat.groups, flat.pointers(), lone_group(rank, 3), kAdamW);
    std::istringstream in(saved.str());
    opt.load_state(in);
    CHECK(opt.steps() == 7);
    const auto st = opt.state();
    for (size_t g = 0; g < flat.groups.size(); ++g) {
      const auto& group = flat.groups[g];
      std::vector<float> want(group.shard(), 0.0f);  // padding: zero
      for (const auto& s : group.slots)
        for (size_t j = 0; j < s.param->numel(); ++j) {
          const size_t at = s.offset + j, lo = static_cast<size_t>(rank) * group.shard();
          if (at >= lo && at < lo + group.shard()) want[at - lo] = static_cast<float>(s.index * 1000 + j);
        }
      INFO("rank " << rank << " group " << g);
      REQUIRE(st.buffers[0][g].size() == want.size());
      CHECK(std::vector<float>(st.buffers[0][g].data(), st.buffers[0][g].data() + want.size()) == want);
      for (float& w : want) w = -w;
      CHECK(std::vector<float>(st.buffers[1][g].data(), st.buffers[1][g].data() + want.size()) == want);
    }
  }
}

TEST_CASE("ShardedOptimizer refuses a layout that does not match its shards or group", "[train][sharding]") {
  auto model = ddp::make_mlp({.sizes = {13, 37, 29, 5}, .seed = 1});
  Sharded flat(model->parameters(), 2, 0);
  auto pg = lone_group(0, 2);
  // Laid out for 2 ranks, the group has 3.
  CHECK_THROWS_AS(ddp::ShardedOptimizer(flat.groups, flat.pointers(), lone_group(0, 3), kAdamW),
                  ddp::InvalidArgument);
  auto fewer = flat.pointers();
  fewer.pop_back();
  CHECK_THROWS_AS(ddp::ShardedOptimizer(flat.groups, fewer, pg, kAdamW), ddp::InvalidArgument);
  auto twice = flat.groups;
  twice[0].slots[0].index = twice[0].slots.size() > 1 ? twice[0].slots[1].index : twice[1].slots[0].index;
  CHECK_THROWS_AS(ddp::ShardedOptimizer(twice, flat.pointers(), pg, kAdamW), ddp::InvalidArgument);
  ddp::ShardedOptimizer opt(flat.groups, flat.pointers(), pg, kAdamW);
  CHECK_THROWS_AS(opt.consolidate_state(2), ddp::InvalidArgument);
  std::istringstream garbage("not a state");
  CHECK_THROWS_AS(opt.load_state(garbage), ddp::Error);
}
