// torchrun's --redirects / --tee values: which of a worker's streams a setting
// applies to, either one value for every local rank ("3") or a per-rank map
// ("0:3,1:1"). Values: 0 none, 1 stdout, 2 stderr, 3 both.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace ddprun {

enum StreamMask : unsigned { kNoStream = 0, kStdout = 1, kStderr = 2, kBothStreams = 3 };

class StreamSpec {
 public:
  StreamSpec() = default;

  // Parses "N" or "R:N,R:N,..." (N in 0..3, R a local rank). Throws UsageError naming
  // `flag` and the offending text.
  static StreamSpec parse(std::string_view flag, std::string_view text);

  // The streams selected for `local_rank` (ranks missing from a map get kNoStream).
  unsigned for_rank(int local_rank) const;

  // True when some rank has some stream selected.
  bool any() const;

  // The largest local rank named in a per-rank map, or -1.
  int max_rank() const;

  // The value in the form parse() reads ("3", or "0:3,1:1"), e.g. to pass it on to
  // another ddprun.
  std::string text() const;

 private:
  unsigned all_ = kNoStream;
  std::map<int, unsigned> per_rank_;
};

}  // namespace ddprun
