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
  std::optional<std::string> store_type;    // as given: only torchrun's c10d backend reads it
  std::vector<std::string> notes;           // "--rdzv_conf KEY has no effect: why"
};

// Throws UsageError naming the whole value, the bad item and the keys ddprun knows:
// not key=value, an empty key or value, a bad number or boolean, or a key torchrun
// does not read either.
RdzvConf parse_rdzv_conf(const std::string& text);

// A number of seconds (up to a year), or nothing; the flags' seconds are read with it too.
std::optional<double> seconds_value(const std::string& text, bool allow_zero);

// store_type under a rendezvous that reads it (torchrun's c10d; ddprun's c10d, ddprun
// and standalone): tcp is what ddprun runs; file and anything else throw UsageError.
// Under the static rendezvous, which does not read it, a note saying so.
std::optional<std::string> judge_store_type(const std::string& value, bool read_by_backend);

}  // namespace ddprun
