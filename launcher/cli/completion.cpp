// Completion scripts (completion.hpp). Each shell gets the same facts: the option
// spellings, which of them take a value, the fixed values some take, and where the
// program starts (the first word that is neither an option nor an option's value;
// after it every word is the program's, as ddprun reads the command line).
#include "cli/completion.hpp"

#include <CLI/CLI.hpp>
#include <map>
#include <sstream>

namespace ddprun {
namespace {

struct Spelled {
  std::vector<std::string> names;  // "--nproc_per_node", "--nproc-per-node", "-r", ...
  bool takes_value = false;
  std::string description;         // its first clause, for zsh
};

// The first long name without its dashes ("" for a short-only option such as -x).
std::string canonical(const Spelled& s) {
  return s.names.front().size() > 2 && s.names.front()[1] == '-' ? s.names.front().substr(2) : "";
}

// The fixed values of options that take one of a few words (by the first long name).
const std::map<std::string, std::string>& choices() {
  static const std::map<std::string, std::string> table = {
      {"nproc_per_node", "gpu cpu auto xpu"},
      {"rdzv_backend", "static c10d ddprun"},
      {"redirects", "0 1 2 3"},
      {"tee", "0 1 2 3"},
      {"stall_action", "report stop"},
      {"numa_binding", "node socket exclusive core-complex"},
      {"start_method", "spawn fork forkserver"},
      {"event_log_handler", "null console dynamic_rendezvous"},
      {"print_completion", "bash zsh tcsh"},
  };
  return table;
}

const std::string* choices_of(const Spelled& s) {
  auto c = choices().find(canonical(s));
  return s.takes_value && c != choices().end() ? &c->second : nullptr;
}

// Options that name a file or directory (completed as paths; the rest take free text).
bool takes_path(const Spelled& s) {
  const std::string name = canonical(s);
  return s.takes_value &&
         (name == "hostfile" || name == "log_dir" || name == "env_file" || name == "rdzv_token_file");
}

// Up to the first "; ", " (", ", e.g" or sentence end (not the dots of "..."), at most 72 characters.
std::string first_clause(std::string text) {
  size_t end = text.size();
  for (const char* stop : {"; ", " (", ", e.g"}) end = std::min(end, text.find(stop));
  for (size_t at = text.find(". "); at != std::string::npos; at = text.find(". ", at + 1)) {
    if (at > 0 && text[at - 1] != '.') {
      end = std::min(end, at);
      break;
    }
  }
  text.resize(std::min(end, text.size()));
  if (text.size() > 72) text = text.substr(0, 69) + "...";
  return text;
}

std::vector<Spelled> spelled_options(const CLI::App& app) {
  std::vector<Spelled> out;
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_group().empty()) continue;  // hidden (--agent_stdin)
    Spelled s;
    for (const auto& l : o->get_lnames()) s.names.push_back("--" + l);
    for (const auto& n : o->get_snames()) s.names.push_back("-" + n);
    if (s.names.empty()) continue;
    s.takes_value = o->get_expected_max() != 0;
    s.description = first_clause(o->get_description());
    out.push_back(std::move(s));
  }
  return out;
}

// `ddprun status`'s options (diagnose/status.cpp reads them by hand, both spellings).
std::vector<Spelled> status_options() {
  auto both = [](const std::string& name, bool value, const std::string& description) {
    std::string dashed = name;
    for (size_t i = 2; i < dashed.size(); ++i) dashed[i] = dashed[i] == '_' ? '-' : dashed[i];
    std::vector<std::string> names = {name};
    if (dashed != name) names.push_back(dashed);
    return Spelled{names, value, description};
  };
  return {both("--run_id", true, "the job on this machine"),
          both("--rdzv_id", true, "the job at an endpoint"),
          both("--rdzv_endpoint", true, "a ddp-rendezvous daemon HOST:PORT"),
          both("--rdzv_token_file", true, "the daemon's token"),
          both("--json", false, "one JSON object"),
          both("--watch", false, "refresh every S seconds"),
          Spelled{{"--help", "-h"}, false, "usage"}};
}

std::string join(const std::vector<std::string>& words, const std::string& between = " ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : between) + w;
  return out;
}

std::vector<std::string> all_names(const std::vector<Spelled>& options, bool valued_only = false) {
  std::vector<std::string> out;
  for (const auto& s : options) {
    if (valued_only && !s.takes_value) continue;
    out.insert(out.end(), s.names.begin(), s.names.end());
  }
  return out;
}

// ---- bash ------------------------------------------------------------------
// The script reads the line itself (COMP_LINE), split at white space only: COMP_WORDS
// is also split at bash's word breaks ('=' and ':' among them), which values such as
// --nnodes 1:2 or --rdzv_endpoint=host:29400 hold. Replies go through mapfile, one
// per line, so names with spaces stay whole and no glob option changes them.
std::string bash_script(const std::vector<Spelled>& options) {
  std::ostringstream cases;
  for (const auto& s : options) {
    const std::string pattern = join(s.names, "|");
    if (const std::string* c = choices_of(s)) {
      cases << "      " << pattern << ") mapfile -t COMPREPLY < <(compgen -W '" << *c << "' -- \"$value\") ;;\n";
    } else if (takes_path(s)) {
      cases << "      " << pattern << ") _ddprun_files \"$value\" ;;\n";
    }
  }
  std::ostringstream out;
  out << "# bash completion for ddprun: source <(ddprun --print-completion bash), or save it as\n"
         "# ~/.local/share/bash-completion/completions/ddprun\n"
         "_ddprun_files() {\n"
         "  compopt -o filenames 2>/dev/null\n"
         "  mapfile -t COMPREPLY < <(compgen -f -- \"$1\")\n"
         "}\n"
         "_ddprun() {\n"
         "  local IFS=$' \\t\\n' line=${COMP_LINE:0:COMP_POINT} words=() i=1 w program= cur option= value\n"
         "  read -ra words <<< \"$line\"\n"
         "  if [[ -z $line || $line == *[[:space:]] ]]; then words+=(''); fi\n"
         "  local cword=$(( ${#words[@]} - 1 ))\n"
         "  cur=${words[cword]}\n"
         "  COMPREPLY=()\n"
         "  if [[ ${words[1]-} == status ]] && (( cword > 1 )); then\n"
         "    [[ $cur == -* ]] && mapfile -t COMPREPLY < <(compgen -W '" << join(all_names(status_options())) << "' -- \"$cur\")\n"
         "    return 0\n"
         "  fi\n"
         "  local valued=' " << join(all_names(options, true)) << " '\n"
         "  # Past ddprun's options and their values to the program: its words are its own.\n"
         "  while (( i < cword )); do\n"
         "    w=${words[i]}\n"
         "    if [[ $w == -- ]]; then (( i++ )); program=1; break; fi\n"
         "    [[ $w == -* ]] || break\n"
         "    if [[ $w != *=* && $valued == *\" $w \"* ]]; then (( i += 2 )); else (( i++ )); fi\n"
         "  done\n"
         "  if (( i < cword )); then\n"
         "    if declare -F _command_offset >/dev/null; then\n"
         "      # bash-completion's, which counts in COMP_WORDS: the program's index there.\n"
         "      local j=0 k acc\n"
         "      for (( k = 0; k < i; k++ )); do\n"
         "        acc=${COMP_WORDS[j++]-}\n"
         "        while [[ $acc != \"${words[k]}\" ]] && (( j < ${#COMP_WORDS[@]} )); do acc+=${COMP_WORDS[j++]}; done\n"
         "      done\n"
         "      _command_offset \"$j\"\n"
         "    else\n"
         "      _ddprun_files \"$cur\"\n"
         "    fi\n"
         "    return 0\n"
         "  fi\n"
         "  # A value: the word after an option that takes one, or --option=VALUE.\n"
         "  if (( i > cword )); then option=${words[cword-1]}; value=$cur\n"
         "  elif [[ $cur == -*=* && -z $program ]]; then option=${cur%%=*}; value=${cur#*=}\n"
         "  fi\n"
         "  if [[ -n $option ]]; then\n"
         "    case $option in\n"
      << cases.str()
      << "    esac\n"
         "    return 0\n"
         "  fi\n"
         "  if [[ $cur == -* && -z $program ]]; then\n"
         "    mapfile -t COMPREPLY < <(compgen -W '" << join(all_names(options)) << "' -- \"$cur\")\n"
         "    return 0\n"
         "  fi\n"
         "  # The program: `status` first, then commands and files.\n"
         "  compopt -o filenames 2>/dev/null\n"
         "  mapfile -t COMPREPLY < <(\n"
         "    if [[ -z $program ]] && (( cword == 1 )); then compgen -W status -- \"$cur\"; fi\n"
         "    if [[ $cur != */* ]]; then compgen -c -- \"$cur\"; fi\n"
         "    compgen -f -- \"$cur\")\n"
         "  return 0\n"
         "}\n"
         "complete -o bashdefault -o default -F _ddprun ddprun\n";
  return out.str();
}

// ---- zsh -------------------------------------------------------------------
// Text inside a single-quoted _arguments spec: brackets and colons escaped, quotes closed.
std::string zsh_text(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\'') out += "'\\''";
    else if (c == '[' || c == ']' || c == ':' || c == '\\') out += std::string("\\") + c;
    else out += c;
  }
  return out;
}

// One _arguments spec per option: its spellings exclude each other; a value goes in
// the next word or after '=' (long) or right after the letter (short).
std::string zsh_specs(const std::vector<Spelled>& options, const std::string& indent) {
  std::ostringstream specs;
  for (const auto& s : options) {
    std::string action;
    if (const std::string* c = choices_of(s)) action = ":value:(" + *c + ")";
    else if (takes_path(s)) action = ":path:_files";
    else if (s.takes_value) action = ":value: ";
    std::vector<std::string> forms;
    for (const auto& n : s.names) forms.push_back(n + (s.takes_value ? (n.size() == 2 ? "+" : "=") : ""));
    specs << indent << "'(" << join(s.names) << ")'";
    specs << (forms.size() == 1 ? "'" + forms.front() : "{" + join(forms, ",") + "}'");
    specs << "[" << zsh_text(s.description) << "]" << action << "'\n";
  }
  return specs.str();
}

std::string zsh_script(const std::vector<Spelled>& options) {
  std::ostringstream out;
  out << "#compdef ddprun\n"
         "# zsh completion for ddprun: save it as _ddprun in a directory of $fpath, or\n"
         "# source <(ddprun --print-completion zsh) after compinit\n"
         "_ddprun() {\n"
         "  local -a specs\n"
         "  if (( CURRENT > 2 )) && [[ $words[2] == status ]]; then\n"
         "    shift words; (( CURRENT-- ))\n"
         "    specs=(\n"
      << zsh_specs(status_options(), "      ")
      << "    )\n"
         "    _arguments $specs\n"
         "    return\n"
         "  fi\n"
         "  specs=(\n"
      << zsh_specs(options, "    ")
      << "    '(-)1:program:{_alternative \"files:file:_files\" \"commands:command:_command_names -e\" "
         "\"subcommands:subcommand:(status)\"}'\n"
         "    '*::program argument:_normal'\n"
         "  )\n"
         "  _arguments -S $specs\n"
         "}\n"
         "if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _ddprun \"$@\"; else compdef _ddprun ddprun; fi\n";
  return out.str();
}

// ---- tcsh ------------------------------------------------------------------
// One line without a comment, so that eval "`ddprun --print-completion tcsh`" takes it.
// tcsh's `complete` has no notion of where the program starts: its patterns apply to
// every word.
std::string tcsh_script(const std::vector<Spelled>& options) {
  std::vector<std::string> long_names;
  std::string values;
  for (const auto& s : options) {
    for (const auto& n : s.names) {
      if (n.size() > 2) long_names.push_back(n.substr(2));
    }
    const std::string* c = choices_of(s);
    if (!c) continue;
    for (const auto& n : s.names) {
      values += " 'n/" + n + "/(" + *c + ")/'";
      if (n.size() > 2) values += " 'c/" + n + "=/(" + *c + ")/'";
    }
  }
  // The value patterns first: tcsh takes the first pattern that matches a word.
  return "complete ddprun" + values + " 'c/--/(" + join(long_names) + ")/'\n";
}

}  // namespace

std::string completion_script(const CLI::App& app, const std::string& shell) {
  const auto options = spelled_options(app);
  if (shell == "bash") return bash_script(options);
  if (shell == "zsh") return zsh_script(options);
  return tcsh_script(options);
}

}  // namespace ddprun
