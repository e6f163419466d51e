// A small seeded random number generator for model initialisation and shuffling.
//
// Every rank that seeds an Rng with the same value draws the same sequence, on any
// standard library: the engine is std::mt19937_64 (fully specified by the C++
// standard) and the conversions to floats and bounded integers are done here rather
// than by std::*_distribution, whose algorithms are implementation-defined.
#pragma once

#include <cstdint>
#include <random>

namespace ddp {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // 64 uniformly random bits.
  uint64_t next() { return engine_(); }
  // Skips n draws of next() (each float or bit draw takes one; below() may take more),
  // as if they had been made, without tempering them.
  void discard(uint64_t n) { engine_.discard(n); }
  // A float uniform in [0, 1) with 24 random bits.
  float uniform01() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }
  // A float uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(); }
  // An integer uniform in [0, n), unbiased (rejection sampling). n must be > 0.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // largest multiple of n, exclusive
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace ddp
