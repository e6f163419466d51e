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

// Options that name a file or directory (completed as paths; the rest take free text).
bool takes_path(const std::string& long_name) {
  return long_name == "hostfile" || long_name == "log_dir" || long_name == "env_file" ||
         long_name == "rdzv_token_file";
}

// `ddprun status`'s options (diagnose/status.cpp parses them by hand).
const std::vector<std::string> kStatusOptions = {"--run_id", "--rdzv_id", "--rdzv_endpoint", "--rdzv_token_file",
                                                 "--json", "--watch", "--help"};

std::string first_clause(std::string text) {
  for (const char* stop : {"; ", " (", ". ", ", e.g"}) {
    if (auto at = text.find(stop); at != std::string::npos) text.resize(at);
  }
  if (text.size() > 72) text = text.substr(0, 69) + "...";
  return text;
}

std::vector<Spelled> spelled_options(const CLI::App& app) {
  std::vector<Spelled> out;
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_group().empty() || o->get_lnames().empty()) continue;  // hidden (--agent_stdin)
    Spelled s;
    for (const auto& l : o->get_lnames()) s.names.push_back("--" + l);
    for (const auto& n : o->get_snames()) s.names.push_back("-" + n);
    s.takes_value = o->get_expected_max() != 0;
    s.description = first_clause(o->get_description());
    out.push_back(std::move(s));
  }
  return out;
}

std::string canonical(const Spelled& s) { return s.names.front().substr(2); }

std::string join(const std::vector<std::string>& words, const std::string& between = " ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : between) + w;
  return out;
}

// ---- bash ------------------------------------------------------------------
std::string bash_script(const std::vector<Spelled>& options) {
  std::vector<std::string> all, valued;
  std::ostringstream cases;
  for (const auto& s : options) {
    for (const auto& n : s.names) all.push_back(n);
    if (!s.takes_value) continue;
    for (const auto& n : s.names) valued.push_back(n);
    const std::string pattern = join(s.names, "|");
    if (auto c = choices().find(canonical(s)); c != choices().end()) {
      cases << "      " << pattern << ") COMPREPLY=($(compgen -W '" << c->second << "' -- \"$value\")) ;;\n";
    } else if (takes_path(canonical(s))) {
      cases << "      " << pattern << ") COMPREPLY=($(compgen -f -- \"$value\")) ;;\n";
    }
  }
  std::ostringstream out;
  out << "# bash completion for ddprun: source <(ddprun --print-completion bash), or save it in\n"
         "# ~/.local/share/bash-completion/completions/ddprun\n"
         "_ddprun() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} i=1 w program=\n"
         "  local options='" << join(all) << "'\n"
         "  local valued=' " << join(valued) << " '\n"
         "  if [[ ${COMP_WORDS[1]} == status && $COMP_CWORD -gt 1 ]]; then\n"
         "    [[ $cur == -* ]] && COMPREPLY=($(compgen -W '" << join(kStatusOptions) << "' -- \"$cur\"))\n"
         "    return 0\n"
         "  fi\n"
         "  # Skip ddprun's options and their values (bash splits --option=value at '=') to\n"
         "  # the program: from there on the words are the program's.\n"
         "  while (( i < COMP_CWORD )); do\n"
         "    w=${COMP_WORDS[i]}\n"
         "    if [[ $w == -- ]]; then (( i++ )); program=1; break; fi\n"
         "    [[ $w == -* ]] || break\n"
         "    if [[ ${COMP_WORDS[i+1]} == = ]]; then (( i += 3 ))\n"
         "    elif [[ $valued == *\" $w \"* ]]; then (( i += 2 ))\n"
         "    else (( i++ )); fi\n"
         "  done\n"
         "  if (( i < COMP_CWORD )); then\n"
         "    if declare -F _command_offset >/dev/null; then _command_offset \"$i\"; else COMPREPLY=($(compgen -f -- \"$cur\")); fi\n"
         "    return 0\n"
         "  fi\n"
         "  # Past the word being completed: it is the value of the option before it.\n"
         "  if (( i > COMP_CWORD )); then\n"
         "    local option=$prev value=$cur\n"
         "    if [[ $cur == = ]]; then value=''; elif [[ $prev == = ]]; then option=${COMP_WORDS[COMP_CWORD-2]}; fi\n"
         "    case $option in\n"
      << cases.str()
      << "      *) COMPREPLY=() ;;\n"
         "    esac\n"
         "    return 0\n"
         "  fi\n"
         "  if [[ $cur == -* && -z $program ]]; then\n"
         "    COMPREPLY=($(compgen -W \"$options\" -- \"$cur\"))\n"
         "  elif [[ $cur == */* ]]; then\n"
         "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  else\n"
         "    (( COMP_CWORD == 1 )) && COMPREPLY=($(compgen -W status -- \"$cur\"))\n"
         "    COMPREPLY+=($(compgen -c -f -- \"$cur\"))\n"
         "  fi\n"
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

std::string zsh_script(const std::vector<Spelled>& options) {
  std::ostringstream specs;
  for (const auto& s : options) {
    std::string action;
    if (s.takes_value) {
      if (auto c = choices().find(canonical(s)); c != choices().end()) action = ":value:(" + c->second + ")";
      else if (takes_path(canonical(s))) action = ":path:_files";
      else action = ":value: ";
    }
    std::vector<std::string> forms;
    for (const auto& n : s.names) forms.push_back(n + (s.takes_value ? (n.size() == 2 ? "+" : "=") : ""));
    specs << "    '(" << join(s.names) << ")'";
    specs << (forms.size() == 1 ? "'" + forms.front() : "{" + join(forms, ",") + "}'");
    specs << "[" << zsh_text(s.description) << "]" << action << "'\n";
  }
  std::ostringstream out;
  out << "#compdef ddprun\n"
         "# zsh completion for ddprun: save it as _ddprun in a directory of $fpath, or\n"
         "# source <(ddprun --print-completion zsh) after compinit\n"
         "_ddprun() {\n"
         "  if (( CURRENT > 2 )) && [[ $words[2] == status ]]; then\n"
         "    shift words; (( CURRENT-- ))\n"
         "    _arguments '--run_id=[the job on this machine]:run id: ' '--rdzv_id=[the job at an endpoint]:run id: ' "
         "'--rdzv_endpoint=[a ddp-rendezvous daemon]:host\\:port: ' '--rdzv_token_file=[its token]:path:_files' "
         "'--json[one JSON object]' '--watch[refresh every S seconds]' '--help[usage]'\n"
         "    return\n"
         "  fi\n"
         "  local -a specs\n"
         "  specs=(\n"
      << specs.str()
      << "    '(-)1:program:_command_names -e'\n"
         "    '*::program argument:_normal'\n"
         "  )\n"
         "  _arguments -S $specs\n"
         "}\n"
         "if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _ddprun \"$@\"; else compdef _ddprun ddprun; fi\n";
  return out.str();
}

// ---- tcsh ------------------------------------------------------------------
std::string tcsh_script(const std::vector<Spelled>& options) {
  std::vector<std::string> long_names;
  std::string next;
  for (const auto& s : options) {
    for (const auto& n : s.names) {
      if (n.size() > 2) long_names.push_back(n.substr(2));
    }
    auto c = choices().find(canonical(s));
    if (!s.takes_value || c == choices().end()) continue;
    for (const auto& n : s.names) next += " 'n/" + n + "/(" + c->second + ")/'";
  }
  // One line without a comment, so that eval "`ddprun --print-completion tcsh`" takes it.
  return "complete ddprun 'c/--/(" + join(long_names) + ")/'" + next + "\n";
}

}  // namespace

std::string completion_script(const CLI::App& app, const std::string& shell) {
  const auto options = spelled_options(app);
  if (shell == "bash") return bash_script(options);
  if (shell == "zsh") return zsh_script(options);
  return tcsh_script(options);
}

}  // namespace ddprun
