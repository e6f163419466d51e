// process_state.hpp: one read of /proc/<pid>/stat.
#include "supervise/process_state.hpp"

#include <fstream>
#include <sstream>
#include <string>

namespace ddprun {

char process_state_letter(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  // "pid (comm) S ...": comm may hold spaces and parentheses, so the last ')' ends it.
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

}  // namespace ddprun
