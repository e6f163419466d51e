#include "group_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backend.hpp"

namespace ddp {
namespace detail {

size_t page_rounded(size_t bytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) throw InvalidArgument("allocate: " + std::to_string(bytes) + " bytes is too large");
  return std::max<size_t>(1, (bytes + page - 1) / page) * page;
}

std::byte* map_private(size_t mapped_bytes) {
  void* p = ::mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw Error("allocate: cannot map " + std::to_string(mapped_bytes) + " bytes: " + std::strerror(errno));
  }
  return static_cast<std::byte*>(p);
}

MappedMemory::~MappedMemory() {
  if (on_free_) on_free_();
  ::munmap(data(), mapped_bytes_);
}

// Backends without memory of their own to offer hand out plain pages.
std::unique_ptr<GroupMemory> Backend::allocate_memory(size_t bytes) {
  const size_t mapped = page_rounded(bytes);
  return std::make_unique<MappedMemory>(map_private(mapped), mapped, bytes, false);
}

}  // namespace detail
}  // namespace ddp
