#include "heap_blocks.hpp"

#include <malloc.h>

#include <cstdint>

namespace rdzv::heap {

namespace {
constexpr size_t kHeaderWord = sizeof(size_t);
constexpr size_t kGranule = 16;
constexpr size_t kSmallest = 32;
constexpr size_t kPage = 4096;
}  // namespace

size_t block_bytes(const void* p) noexcept {
  return p == nullptr ? 0 : malloc_usable_size(const_cast<void*>(p)) + kHeaderWord;
}

size_t predicted_bytes(size_t n) noexcept {
  if (n >= kMappedFrom) return (n + 2 * kHeaderWord + kPage - 1) / kPage * kPage;
  size_t granules = (n + kHeaderWord + kGranule - 1) / kGranule * kGranule;
  return granules < kSmallest ? kSmallest : granules;
}

size_t string_bytes(const std::string& s) noexcept {
  auto chars = reinterpret_cast<std::uintptr_t>(s.data());
  auto self = reinterpret_cast<std::uintptr_t>(&s);
  bool inside = chars >= self && chars < self + sizeof(s);  // the short-string buffer
  return inside ? 0 : block_bytes(s.data());
}

size_t predicted_string_bytes(size_t n) noexcept {
  return n <= std::string().capacity() ? 0 : predicted_bytes(n + 1);
}

void tune_allocator() noexcept {
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMappedFrom));
  mallopt(M_ARENA_MAX, 1);
}

void give_back() noexcept { malloc_trim(0); }

}  // namespace rdzv::heap
