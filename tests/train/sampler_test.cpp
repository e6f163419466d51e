// DistributedSampler: torch's partitioning, padding and drop_last, and a shuffle
// that depends only on (seed, epoch).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "ddp/sampler.hpp"
#include "ddp/types.hpp"

namespace {

using Indices = std::vector<size_t>;

std::vector<Indices> all_ranks(size_t n, ddp::DistributedSamplerOptions o, uint64_t epoch = 0) {
  std::vector<Indices> out;
  for (size_t r = 0; r < o.num_replicas; ++r) {
    o.rank = r;
    ddp::DistributedSampler s(n, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    CHECK(out.back().size() == s.size());
  }
  return out;
}

}  // namespace

TEST_CASE("without shuffle, ranks take every R-th index and pad from the start", "[train][sampler]") {
  // torch: N = 10, R = 3 -> total 12, indices 0..9,0,1; rank r takes [r::3].
  const auto ranks = all_ranks(10, {.num_replicas = 3, .shuffle = false});
  CHECK(ranks[0] == Indices{0, 3, 6, 9});
  CHECK(ranks[1] == Indices{1, 4, 7, 0});
  CHECK(ranks[2] == Indices{2, 5, 8, 1});
  ddp::DistributedSampler s(10, {.num_replicas = 3, .rank = 0, .shuffle = false});
  CHECK(s.size() == 4);
  CHECK(s.total_size() == 12);
}

TEST_CASE("padding longer than the dataset repeats the whole list", "[train][sampler]") {
  // N = 2, R = 5: torch repeats [0, 1] ceil(3 / 2) times and cuts to 3 -> 0,1,0,1,0.
  const auto ranks = all_ranks(2, {.num_replicas = 5, .shuffle = false});
  CHECK(ranks == std::vector<Indices>{{0}, {1}, {0}, {1}, {0}});
  // N = 3, R = 8: 0,1,2 then 0,1,2,0,1.
  const auto more = all_ranks(3, {.num_replicas = 8, .shuffle = false});
  const std::vector<Indices> expect = {{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}};
  CHECK(more == expect);
}

TEST_CASE("drop_last drops the tail so every rank gets floor(N/R)", "[train][sampler]") {
  const auto ranks = all_ranks(10, {.num_replicas = 3, .shuffle = false, .drop_last = true});
  CHECK(ranks[0] == Indices{0, 3, 6});
  CHECK(ranks[1] == Indices{1, 4, 7});
  CHECK(ranks[2] == Indices{2, 5, 8});
  ddp::DistributedSampler few(2, {.num_replicas = 4, .rank = 3, .drop_last = true});
  CHECK(few.size() == 0);
  CHECK(few.indices().empty());
  ddp::DistributedSampler even(12, {.num_replicas = 4, .rank = 1, .drop_last = true});
  CHECK(even.size() == 3);
}

TEST_CASE("shuffled ranks are disjoint, equal in length and cover the dataset", "[train][sampler]") {
  for (size_t n : {size_t{1}, size_t{7}, size_t{60000}, size_t{60001}}) {
    for (size_t r : {size_t{1}, size_t{2}, size_t{3}, size_t{8}}) {
      for (bool drop_last : {false, true}) {
        INFO("N " << n << " R " << r << " drop_last " << drop_last);
        const auto ranks = all_ranks(n, {.num_replicas = r, .shuffle = true, .seed = 17, .drop_last = drop_last}, 3);
        const size_t per = drop_last ? n / r : (n + r - 1) / r;
        std::vector<size_t> all;
        for (const auto& idx : ranks) {
          CHECK(idx.size() == per);
          all.insert(all.end(), idx.begin(), idx.end());
        }
        for (size_t i : all) REQUIRE(i < n);
        std::set<size_t> distinct(all.begin(), all.end());
        if (drop_last) {
          CHECK(distinct.size() == all.size());  // no index twice
        } else {
          CHECK(distinct.size() == n);  // every index visited
          // The global list (rank k % r holds position k) pads by repeating its start.
          for (size_t k = n; k < per * r; ++k) CHECK(ranks[k % r][k / r] == ranks[(k - n) % r][(k - n) / r]);
        }
      }
    }
  }
}

TEST_CASE("the shuffle depends only on seed + epoch and changes with the epoch", "[train][sampler]") {
  const ddp::DistributedSamplerOptions o{.num_replicas = 2, .rank = 1, .shuffle = true, .seed = 5};
  ddp::DistributedSampler a(1000, o), b(1000, o);
  a.set_epoch(2);
  b.set_epoch(2);
  CHECK(a.indices() == b.indices());  // another process computes the same
  const auto epoch2 = a.indices();
  a.set_epoch(3);
  CHECK(a.indices() != epoch2);
  CHECK(a.epoch() == 3);
  auto other_seed = o;
  other_seed.seed = 6;
  ddp::DistributedSampler c(1000, other_seed);
  c.set_epoch(2);
  CHECK(c.indices() != epoch2);
  // Like torch (generator seeded with seed + epoch): seed 6 epoch 1 == seed 5 epoch 2.
  c.set_epoch(1);
  CHECK(c.indices() == epoch2);
  // Unshuffled is the identity order.
  ddp::DistributedSampler plain(6, {.num_replicas = 1, .shuffle = false});
  CHECK(plain.indices() == Indices{0, 1, 2, 3, 4, 5});
  // A shuffled epoch is a real permutation, not the identity.
  ddp::DistributedSampler one(1000, {.num_replicas = 1, .shuffle = true, .seed = 0});
  auto perm = one.indices();
  CHECK_FALSE(std::is_sorted(perm.begin(), perm.end()));
  std::sort(perm.begin(), perm.end());
  for (size_t i = 0; i < perm.size(); ++i) REQUIRE(perm[i] == i);
}

TEST_CASE("sampler options are validated", "[train][sampler]") {
  CHECK_THROWS_AS(ddp::DistributedSampler(10, {.num_replicas = 0}), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::DistributedSampler(10, {.num_replicas = 2, .rank = 2}), ddp::InvalidArgument);
  ddp::DistributedSampler empty(0, {.num_replicas = 2, .rank = 1});
  CHECK(empty.size() == 0);
  CHECK(empty.indices().empty());
}
