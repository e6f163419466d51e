#include "cli/stream_spec.hpp"

#include <string>

#include "errors.hpp"
#include "ddp/contract/parse.hpp"

namespace ddprun {
namespace {

unsigned parse_mask(std::string_view flag, std::string_view whole, std::string_view value) {
  auto n = ddp::contract::parse_integer(value);
  if (!n || *n < 0 || *n > 3) {
    throw UsageError("invalid " + std::string(flag) + " '" + std::string(whole) +
                     "': expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per-rank map like 0:3,1:1");
  }
  return static_cast<unsigned>(*n);
}

}  // namespace

StreamSpec StreamSpec::parse(std::string_view flag, std::string_view text) {
  StreamSpec spec;
  if (text.find(':') == std::string_view::npos) {
    spec.all_ = parse_mask(flag, text, text);
    return spec;
  }
  std::string_view rest = text;
  while (true) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    auto colon = item.find(':');
    auto rank = colon == std::string_view::npos ? std::nullopt : ddp::contract::parse_integer(item.substr(0, colon));
    if (!rank || *rank < 0 || *rank > 1'000'000) {
      throw UsageError("invalid " + std::string(flag) + " '" + std::string(text) +
                       "': each item of a per-rank map is LOCAL_RANK:VALUE, e.g. 0:3,1:1");
    }
    int r = static_cast<int>(*rank);
    if (spec.per_rank_.count(r) != 0) {
      throw UsageError("invalid " + std::string(flag) + " '" + std::string(text) + "': local rank " +
                       std::to_string(r) + " appears twice");
    }
    spec.per_rank_[r] = parse_mask(flag, text, item.substr(colon + 1));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

unsigned StreamSpec::for_rank(int local_rank) const {
  auto it = per_rank_.find(local_rank);
  return it == per_rank_.end() ? all_ : it->second;
}

bool StreamSpec::any() const {
  if (all_ != kNoStream) return true;
  for (const auto& [rank, mask] : per_rank_) {
    if (mask != kNoStream) return true;
  }
  return false;
}

std::string StreamSpec::text() const {
  if (per_rank_.empty()) return std::to_string(all_);
  std::string out;
  for (const auto& [rank, mask] : per_rank_) {
    if (!out.empty()) out += ',';
    out += std::to_string(rank);
    out += ':';
    out += std::to_string(mask);
  }
  return out;
}

int StreamSpec::max_rank() const { return per_rank_.empty() ? -1 : per_rank_.rbegin()->first; }

}  // namespace ddprun
