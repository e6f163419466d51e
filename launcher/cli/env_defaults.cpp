// Flag defaults from PET_* variables (env_defaults.hpp).
#include "cli/env_defaults.hpp"

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdlib>
#include <string_view>

#include "errors.hpp"

namespace ddprun {
namespace {

// The options a PET_* variable can set: those with a long name that a user gives
// (not --help, --version, one marked configurable(false) such as --print_completion,
// nor a hidden option such as --agent_stdin).
std::vector<CLI::Option*> settable_options(CLI::App& app) {
  return app.get_options([&app](CLI::Option* o) {
    return !o->get_lnames().empty() && !o->get_group().empty() && o->get_configurable() &&
           o != app.get_help_ptr() && o != app.get_version_ptr();
  });
}

std::vector<std::string> long_spellings(const CLI::Option& o) {
  std::vector<std::string> out;
  for (const auto& name : o.get_lnames()) out.push_back("--" + name);
  return out;
}

bool is_on_off(const CLI::Option& o) { return o.get_expected_max() == 0; }

// The value the command line gave an option (the last one: a flag given twice takes it).
std::string given_value(const CLI::Option& o) { return o.results().empty() ? "" : o.results().back(); }

// Whether `flag` appears in `text` as a whole word ("--nnodes", not "--nnodes_x").
bool names_flag(const std::string& text, const std::string& flag) {
  for (auto at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    const bool word_end = end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) ||
                                                  text[end] == '_' || text[end] == '-');
    if (word_end && (at == 0 || text[at - 1] != '-')) return true;
  }
  return false;
}

[[noreturn]] void invalid_env(const std::string& variable, const std::string& value, const std::string& flag,
                              const std::string& expected) {
  throw UsageError("invalid " + variable + " '" + value + "' (from the environment, for " + flag + "): " + expected);
}

}  // namespace

std::string env_default_variable(const std::string& long_name) {
  std::string name = "PET_";
  for (char c : long_name) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

std::optional<bool> env_flag_value(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return std::nullopt;
  const auto last = text.find_last_not_of(" \t\n\r\f\v");
  std::string_view digits(text.data() + first, last - first + 1);
  if (digits.front() == '+' || digits.front() == '-') digits.remove_prefix(1);
  if (digits.empty()) return std::nullopt;
  bool nonzero = false;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    nonzero = nonzero || c != '0';
  }
  return nonzero;
}

EnvDefaults EnvDefaults::command_line_only(CLI::App& app) {
  EnvDefaults out;
  for (CLI::Option* o : settable_options(app)) {
    if (o->count() == 0) continue;
    out.given_.push_back({"--" + o->get_lnames().front(), long_spellings(*o), "", given_value(*o), is_on_off(*o)});
  }
  return out;
}

EnvDefaults EnvDefaults::apply(CLI::App& app) {
  EnvDefaults out = command_line_only(app);
  for (CLI::Option* o : settable_options(app)) {
    const std::string flag = "--" + o->get_lnames().front();
    const std::string variable = env_default_variable(o->get_lnames().front());
    const char* set = std::getenv(variable.c_str());
    if (set == nullptr) continue;
    const std::string value = set;
    if (o->count() > 0) {
      out.unused_.push_back(variable + "='" + value + "' not used: " + flag + " is on the command line");
      continue;
    }
    if (is_on_off(*o)) {
      const auto on = env_flag_value(value);
      if (!on) invalid_env(variable, value, flag, "expected an integer: 0 for off, any other for on");
      if (!*on) {
        out.unused_.push_back(variable + "='" + value + "': " + flag + " off");
        continue;
      }
      o->add_result("true");
    } else if (value.empty()) {
      // torchrun takes the empty text as the value: where the default is empty too, that is the default.
      if (o->get_default_str().empty()) continue;
      invalid_env(variable, value, flag, "empty; unset it or give a value (default " + o->get_default_str() + ")");
    } else {
      o->add_result(value);
    }
    try {
      o->run_callback();  // stores the value where the option keeps it, through the option's checks
    } catch (const CLI::ParseError& e) {
      invalid_env(variable, value, flag, e.what());
    }
    out.given_.push_back({flag, long_spellings(*o), variable, value, is_on_off(*o)});
  }
  return out;
}

std::vector<std::string> EnvDefaults::notes() const {
  std::vector<std::string> out;
  for (const auto& g : given_) {
    if (g.variable.empty()) {
      out.push_back(g.flag + (g.on_off ? "" : "=" + g.value) + " from the command line");
    } else if (g.on_off) {
      out.push_back(g.flag + " from " + g.variable + "='" + g.value + "'");
    } else {
      out.push_back(g.flag + "=" + g.value + " from " + g.variable);
    }
  }
  out.insert(out.end(), unused_.begin(), unused_.end());
  return out;
}

std::string EnvDefaults::explain(const std::string& message) const {
  std::string out = message;
  std::string named;  // "--x is PET_X=v, ..." for the flags the message names
  for (const auto& g : given_) {
    if (g.variable.empty()) continue;
    bool rewritten = false;
    for (const auto& spelling : g.spellings) {
      const std::string head = "invalid " + spelling + " '";
      if (out.rfind(head, 0) != 0) continue;
      // The quoted value ends at "': " (the value itself, where it is the variable's, may hold one).
      size_t end = out.compare(head.size(), g.value.size() + 1, g.value + "'") == 0 ? head.size() + g.value.size()
                                                                                     : out.find("': ", head.size());
      if (end == std::string::npos) continue;
      out = "invalid " + g.variable + " '" + out.substr(head.size(), end - head.size()) +
            "' (from the environment, for " + g.flag + ")" + out.substr(end + 1);
      rewritten = true;
      break;
    }
    if (rewritten) continue;
    for (const auto& spelling : g.spellings) {
      if (names_flag(out, spelling)) {
        named += (named.empty() ? "" : ", ") + spelling + " is " + g.variable + "=" + g.value;
        break;
      }
    }
  }
  return named.empty() ? out : out + " (from the environment: " + named + ")";
}

}  // namespace ddprun
