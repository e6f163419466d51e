// GroupMemory backed by an mmap'ed range (see ProcessGroup::allocate).
#pragma once
#include <functional>

#include "ddp/process_group.hpp"

namespace ddp::detail {

// `bytes` rounded up to whole pages (at least one).
size_t page_rounded(size_t bytes);

// Private anonymous pages (zero-filled). Throws Error when the system refuses.
std::byte* map_private(size_t mapped_bytes);

class MappedMemory final : public GroupMemory {
 public:
  // Owns [p, p + mapped_bytes); `on_free` runs first when it is freed.
  MappedMemory(std::byte* p, size_t mapped_bytes, size_t bytes, bool shared, std::function<void()> on_free = {})
      : GroupMemory(p, bytes, shared), mapped_bytes_(mapped_bytes), on_free_(std::move(on_free)) {}
  ~MappedMemory() override;

 private:
  size_t mapped_bytes_;
  std::function<void()> on_free_;
};

}  // namespace ddp::detail
