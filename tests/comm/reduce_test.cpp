// The CPU backend's element-wise kernels (src/cpu/reduce.hpp): the Avg division at
// world sizes the collective matrix (1-8 ranks) never reaches.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "cpu/reduce.hpp"

TEST_CASE("Avg divides by the world size in a wide type, also for u8 at 256 ranks and more", "[reduce]") {
  // The sum of 256 ranks' u8 values wraps modulo 256 like any u8 sum; the division
  // itself must neither trap (256 cast to u8 is 0) nor divide by 1 (257 is 1).
  std::vector<uint8_t> v = {255, 200, 7, 0};
  ddp::cpu::divide(ddp::DType::U8, v.data(), v.size(), 256);
  CHECK(v == std::vector<uint8_t>{0, 0, 0, 0});
  v = {255, 200, 7, 0};
  ddp::cpu::divide(ddp::DType::U8, v.data(), v.size(), 257);
  CHECK(v == std::vector<uint8_t>{0, 0, 0, 0});
  v = {255, 200, 7, 0};
  ddp::cpu::divide(ddp::DType::U8, v.data(), v.size(), 5);
  CHECK(v == std::vector<uint8_t>{51, 40, 1, 0});
  std::vector<int32_t> w = {-7, 1000, 300};
  ddp::cpu::divide(ddp::DType::I32, w.data(), w.size(), 300);
  CHECK(w == std::vector<int32_t>{0, 3, 1});  // truncating, as documented
  std::vector<float> f = {3.0f, -1.5f};
  ddp::cpu::divide(ddp::DType::F32, f.data(), f.size(), 300);
  CHECK(f == std::vector<float>{3.0f / 300.0f, -1.5f / 300.0f});
}
