// What the C library's allocator really holds for the server's blocks, so that the
// memory budget charges it (not just the bytes a client sent), and giving free memory
// back to the system. The measured sizes are exact (malloc_usable_size); the predicted
// ones follow glibc's rounding and are only used to refuse a request before it allocates.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace rdzv::heap {

// Bytes a live block from malloc / operator new occupies: its usable size plus the
// allocator's header word. 0 for nullptr.
size_t block_bytes(const void* p) noexcept;
// Bytes a request of `n` bytes will occupy: 16-byte granules with a header word, at
// least 32, or whole pages for a block mapped on its own (kMappedFrom and up).
size_t predicted_bytes(size_t n) noexcept;
// The heap block behind a string: 0 while its characters fit inside the object itself.
size_t string_bytes(const std::string& s) noexcept;
// What a copy of a string of `n` characters occupies on the heap (predicted_bytes).
size_t predicted_string_bytes(size_t n) noexcept;

// Blocks from this size up get pages of their own (mmap), returned to the system when
// freed; the daemon fixes glibc's threshold there (tune_allocator()).
inline constexpr size_t kMappedFrom = size_t{128} << 10;
// Settings for a long-running server: blocks of kMappedFrom and more mapped on their
// own (glibc otherwise raises that threshold as big blocks come and go, and later big
// values land in the heap and fragment it), one malloc arena. Call before other threads start.
void tune_allocator() noexcept;
// Hands free memory in the heap (at its end and whole free pages in its middle) back
// to the system: after a namespace or many connections went.
void give_back() noexcept;

// A std::allocator that adds every block's block_bytes() to a counter it points to,
// and takes them off again when the block is freed: a container's exact footprint.
template <typename T>
class CountingAllocator {
 public:
  using value_type = T;
  explicit CountingAllocator(size_t* counter) noexcept : counter_(counter) {}
  template <typename U>
  CountingAllocator(const CountingAllocator<U>& other) noexcept : counter_(other.counter()) {}

  T* allocate(size_t n) {
    T* p = std::allocator<T>().allocate(n);
    *counter_ += block_bytes(p);
    return p;
  }
  void deallocate(T* p, size_t n) noexcept {
    *counter_ -= block_bytes(p);
    std::allocator<T>().deallocate(p, n);
  }
  size_t* counter() const noexcept { return counter_; }
  template <typename U>
  bool operator==(const CountingAllocator<U>& other) const noexcept {
    return counter_ == other.counter();
  }

 private:
  size_t* counter_;
};

}  // namespace rdzv::heap
