// torchrun's --rdzv_conf key=value,... settings, as ddprun reads them.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddprun {

// The settings with a meaning here; every other key torchrun 2.x's c10d and static
// rendezvous read is accepted (scripts written for torchrun keep working) with a note
// saying why it changes nothing here.
struct RdzvConf {
  std::optional<double> join_timeout;       // join_timeout or timeout
  std::optional<double> last_call_timeout;
  std::optional<bool> is_host;
  std::vector<std::string> notes;           // "--rdzv_conf KEY has no effect: why"
};

// Throws UsageError naming the whole value, the bad item and the keys ddprun knows:
// not key=value, a bad number or boolean, store_type=file or another store, or a key
// torchrun does not read either.
RdzvConf parse_rdzv_conf(const std::string& text);

// A number of seconds (up to a year), or nothing; the flags' seconds are read with it too.
std::optional<double> seconds_value(const std::string& text, bool allow_zero);

}  // namespace ddprun
