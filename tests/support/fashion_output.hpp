// Reading what examples/fashion_mnist prints (rank 0's lines, through ddprun's
// "[rankN]:" prefix or not): the epochs it ran, where it resumed, its restart
// count and its final accuracy. Shared by the training and the elastic tests.
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace fashion {

// The number the pattern's first group captures, for each line it matches.
inline std::vector<int> captured_numbers(const std::string& out, const std::regex& pattern) {
  std::vector<int> numbers;
  for (const auto& l : testing::lines_of(out)) {
    std::smatch m;
    if (std::regex_search(l, m, pattern)) numbers.push_back(std::stoi(m[1]));
  }
  return numbers;
}

// The numbers of the epochs reported ("epoch N loss ..."), in output order.
inline std::vector<int> epochs_run(const std::string& out) {
  return captured_numbers(out, std::regex(R"((?:^|\]:)epoch (\d+) loss )"));
}

// The epochs it resumed at ("resumed from F at epoch N"), one per start that resumed.
inline std::vector<int> resumed_at(const std::string& out) {
  return captured_numbers(out, std::regex(R"(resumed from .* at epoch (\d+), step)"));
}

// One entry per start of the training program: {world size, restart count}.
struct Start {
  int world = 0;
  int restart_count = 0;
};
inline std::vector<Start> starts(const std::string& out) {
  std::vector<Start> s;
  const std::regex line(R"(fashion_mnist: (\d+) worker\(s\) .*, restart_count (\d+)$)");
  for (const auto& l : testing::lines_of(out)) {
    std::smatch m;
    if (std::regex_search(l, m, line)) s.push_back({std::stoi(m[1]), std::stoi(m[2])});
  }
  return s;
}

// The final test accuracy ("RESULT world W test_acc A"), when the run got that far.
inline std::optional<double> final_accuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(RESULT world \d+ test_acc ([0-9.]+))"))) return std::nullopt;
  return std::stod(m[1]);
}

}  // namespace fashion
