// FailureNotice's text form in the store: "node\nrank\nstatus\nhost\nwhat" (the last
// field may not hold newlines).
#include "failure_notice.hpp"

#include <sstream>

namespace ddprun {

std::string FailureNotice::encode() const {
  std::string line = what;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  return std::to_string(node) + "\n" + std::to_string(rank) + "\n" + std::to_string(status) + "\n" + host + "\n" + line;
}

FailureNotice FailureNotice::decode(const std::string& text) {
  FailureNotice n;
  std::istringstream in(text);
  std::string node, rank, status;
  std::getline(in, node);
  std::getline(in, rank);
  std::getline(in, status);
  std::getline(in, n.host);
  std::getline(in, n.what);
  try {
    n.node = std::stoi(node);
    n.rank = std::stoi(rank);
    n.status = std::stoi(status);
  } catch (const std::exception&) {
    n = FailureNotice{};
    n.what = "an unreadable failure notice: " + text.substr(0, 200);
  }
  return n;
}

std::string FailureNotice::describe() const {
  std::string where = "node " + std::to_string(node) + (host.empty() ? "" : " (" + host + ")");
  return (rank >= 0 ? "rank " + std::to_string(rank) + " on " : "") + where + ": " + what;
}

}  // namespace ddprun
