#include "ddp/contract/slurm.hpp"

#include <charconv>
#include <cstdint>

namespace ddp::contract::slurm {
namespace {

[[noreturn]] void bad(std::string_view expr, const std::string& why) {
  throw std::invalid_argument("bad Slurm value '" + std::string(expr) + "': " + why);
}

long parse_number(std::string_view expr, std::string_view digits) {
  long v = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size()) {
    std::string what(digits);
    what.append("' is not a number");  // (not "'" + ...: GCC 12 warns falsely on that form)
    bad(expr, "'" + what);
  }
  return v;
}

// Expands one item (no top-level commas): the first bracket group, then the rest recursively.
void expand_item(std::string_view expr, const std::string& head, std::string_view rest, std::vector<std::string>& out,
                 size_t max_hosts) {
  size_t open = rest.find('[');
  if (open == std::string_view::npos) {
    if (rest.find(']') != std::string_view::npos) bad(expr, "']' without '['");
    if (out.size() >= max_hosts) bad(expr, "more than " + std::to_string(max_hosts) + " hosts");
    out.push_back(head + std::string(rest));
    return;
  }
  size_t close = rest.find(']', open);
  if (close == std::string_view::npos) bad(expr, "'[' without ']'");
  std::string prefix = head + std::string(rest.substr(0, open));
  if (prefix.find(']') != std::string::npos) bad(expr, "']' without '['");
  std::string_view ranges = rest.substr(open + 1, close - open - 1);
  std::string_view tail = rest.substr(close + 1);
  if (ranges.empty()) bad(expr, "empty brackets");
  while (true) {
    size_t comma = ranges.find(',');
    std::string_view range = ranges.substr(0, comma);
    size_t dash = range.find('-');
    std::string_view first = range.substr(0, dash);
    std::string_view last = dash == std::string_view::npos ? first : range.substr(dash + 1);
    long lo = parse_number(expr, first), hi = parse_number(expr, last);
    if (hi < lo) bad(expr, "range " + std::string(range) + " runs backwards");
    if (static_cast<size_t>(hi - lo) >= max_hosts) bad(expr, "more than " + std::to_string(max_hosts) + " hosts");
    for (long v = lo;; ++v) {  // (stops at hi before ++ could overflow)
      std::string number = std::to_string(v);
      if (number.size() < first.size()) number.insert(0, first.size() - number.size(), '0');
      expand_item(expr, prefix + number, tail, out, max_hosts);
      if (v == hi) break;
    }
    if (comma == std::string_view::npos) break;
    ranges.remove_prefix(comma + 1);
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expr, size_t max_hosts) {
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) bad(expr, "']' without '['");
    if (depth > 1) bad(expr, "nested brackets");
    if (c == ',' && depth == 0) {
      std::string_view item = expr.substr(start, i - start);
      if (item.empty()) bad(expr, "empty host name");
      expand_item(expr, "", item, hosts, max_hosts);
      start = i + 1;
    }
  }
  if (depth != 0) bad(expr, "'[' without ']'");
  return hosts;
}

int rendezvous_port(long job_id, long step_id) {
  // Multiplicative hashing: neighbouring jobs and steps land far apart.
  uint64_t mix = static_cast<uint64_t>(job_id) * 0x9E3779B97F4A7C15ull ^
                 static_cast<uint64_t>(step_id < 0 ? 0 : step_id) * 0xC2B2AE3D27D4EB4Full;
  return 10000 + static_cast<int>((mix >> 17) % 20000);
}

int tasks_on_node(std::string_view spec, int node) {
  // Items "N" or "N(xR)", comma-separated: N tasks on each of the next R nodes.
  std::string_view rest = spec;
  int seen = 0;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    size_t paren = item.find("(x");
    long n = parse_number(spec, item.substr(0, paren));
    long repeat = 1;
    if (paren != std::string_view::npos) {
      if (item.back() != ')') bad(spec, "unclosed repeat");
      repeat = parse_number(spec, item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node < seen + repeat) return static_cast<int>(n);
    seen += static_cast<int>(repeat);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  throw std::invalid_argument("SLURM_TASKS_PER_NODE '" + std::string(spec) + "' has no entry for node " +
                              std::to_string(node));
}

std::optional<Step> Step::from_variables(const Variables& vars) {
  constexpr long long kMaxInt = 1 << 30;
  if (!vars.has("SLURM_JOB_ID")) return std::nullopt;
  Step s;
  s.job_id = static_cast<long>(vars.integer("SLURM_JOB_ID", 0, INT32_MAX));
  s.step_id = static_cast<long>(vars.integer_or("SLURM_STEP_ID", 0, 0, INT32_MAX));
  s.nnodes_var = vars.has("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  s.nnodes = static_cast<int>(vars.integer_or(s.nnodes_var, 1, 1, kMaxInt));
  s.node_id = static_cast<int>(vars.integer_or("SLURM_NODEID", 0, 0, kMaxInt));
  if (vars.has("SLURM_NTASKS")) s.ntasks = static_cast<int>(vars.integer("SLURM_NTASKS", 1, kMaxInt));
  if (vars.has("SLURM_PROCID")) s.procid = static_cast<int>(vars.integer("SLURM_PROCID", 0, kMaxInt));
  if (vars.has("SLURM_LOCALID")) s.local_id = static_cast<int>(vars.integer("SLURM_LOCALID", 0, kMaxInt));
  s.tasks_per_node_var = vars.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  s.tasks_per_node = vars.get(s.tasks_per_node_var);
  s.nodelist_var = vars.has("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  s.nodelist = vars.get(s.nodelist_var);
  return s;
}

std::string Step::first_host() const {
  if (!nodelist) throw ContractError("in a Slurm step but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set");
  try {
    return expand_hostlist(*nodelist).front();
  } catch (const std::invalid_argument& e) {
    throw ContractError(nodelist_var + ": " + e.what());
  }
}

int Step::tasks_on(int node) const {
  if (!tasks_per_node) return 1;
  try {
    return tasks_on_node(*tasks_per_node, node);
  } catch (const std::invalid_argument& e) {
    throw ContractError(tasks_per_node_var + ": " + e.what());
  }
}

std::string Step::run_id() const { return "slurm-" + std::to_string(job_id) + "." + std::to_string(step_id); }

}  // namespace ddp::contract::slurm
