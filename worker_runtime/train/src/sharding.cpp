#include "ddp/sharding.hpp"

#include "ddp/types.hpp"

namespace ddp {

std::vector<FlatGroup> bucket_groups(const std::vector<Parameter*>& params, size_t first_cap, size_t cap, int world) {
  if (world < 1) throw InvalidArgument("bucket_groups: world must be at least 1");
  std::vector<FlatGroup> groups;
  if (params.empty()) return groups;
  groups.emplace_back();
  size_t limit = first_cap;
  size_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    Parameter* p = params[k];
    const size_t b = p->numel() * sizeof(float);
    if (!groups.back().slots.empty() && bytes + b > limit) {
      groups.emplace_back();
      bytes = 0;
      limit = cap;
    }
    FlatGroup& g = groups.back();
    g.slots.push_back(ShardSlot{p, k, g.numel});
    g.numel += p->numel();
    bytes += b;
  }
  const auto w = static_cast<size_t>(world);
  for (FlatGroup& g : groups) {
    g.world = world;
    g.padded = (g.numel + w - 1) / w * w;
  }
  return groups;
}

}  // namespace ddp
