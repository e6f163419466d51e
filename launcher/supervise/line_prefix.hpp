// The prefix of each worker line on ddprun's console: "[rankN]:" by default, or
// --log_line_prefix_template (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE) with torchrun's
// fields filled in.
#pragma once

#include <optional>
#include <string>

namespace ddprun {

struct LinePrefixFields {
  int rank = 0;
  int local_rank = 0;
  std::string role_name;
  std::string hostname;  // the short host name, as torchrun's socket.gethostname()
};

struct LinePrefix {
  std::string text;
  // Only the default "[rankN]:" is left off a line that already starts with it (PyTorch
  // 2.x writes it itself on some lines); a template's prefix goes on every line.
  bool skip_when_present = false;
};

// With a template, Python's string.Template.safe_substitute: ${name} and $name are
// replaced for rank, local_rank, role_name and hostname, "$$" is one '$', and anything
// else (an unknown name, a lone '$') stays as written.
LinePrefix line_prefix(const std::optional<std::string>& tmpl, const LinePrefixFields& fields);

}  // namespace ddprun
