// Validation of the --hostfile/--hosts launch flags and --local_addr (remote_flags.hpp).
#include "cli/remote_flags.hpp"

#include <cstdlib>

#include "errors.hpp"

namespace ddprun {
namespace {

bool has_blank_or_control(const std::string& text) {
  for (unsigned char c : text) {
    if (c <= ' ' || c == 0x7f) return true;
  }
  return false;
}

// DDPRUN_SSH's words, split as --ssh_args is (a wrapper such as "ssh -F cfg" or
// "tsh ssh"; quotes keep a path with blanks in one word).
std::vector<std::string> ssh_base_command() {
  const char* env = std::getenv("DDPRUN_SSH");
  if (!env) return {"ssh"};
  std::vector<std::string> words = split_shell_words("DDPRUN_SSH", env);
  if (words.empty()) {
    throw UsageError("DDPRUN_SSH is set but empty: unset it to use ssh, or name the command (e.g. DDPRUN_SSH='ssh -F cfg')");
  }
  return words;
}

void refuse_without_host_list(const RemoteFlags& raw) {
  auto refuse = [](const std::string& flag, const std::string& why) {
    throw UsageError(flag + " needs --hostfile or --hosts: " + why);
  };
  if (!raw.include.empty()) refuse("--include", "it picks hosts and GPUs of the host list");
  if (!raw.exclude.empty()) refuse("--exclude", "it removes hosts and GPUs from the host list");
  if (!raw.exports.empty()) refuse("-x", "it sends variables to the hosts' agents (for this node, export them)");
  if (!raw.env_file.empty()) refuse("--env_file", "it sends variables to the hosts' agents (for this node, export them)");
  if (!raw.ssh_args.empty()) refuse("--ssh_args", "ssh starts the hosts' agents");
  if (!raw.remote_ddprun.empty()) refuse("--remote_ddprun", "it is the path of ddprun on the hosts");
}

void refuse_node_flags(const std::string& list_flag, const NodeFlagsGiven& given, const LaunchOptions& o) {
  auto refuse = [&](const std::string& flag, const std::string& instead) {
    throw UsageError(flag + " cannot be used with " + list_flag + ": " + instead);
  };
  if (given.nnodes && o.elastic()) {
    refuse("an elastic --nnodes MIN:MAX", "a launch from one command runs a fixed set of nodes, the host list's");
  }
  if (given.nnodes) refuse("--nnodes", "the host list is the job's nodes (pick some with --include/--exclude)");
  if (given.node_rank) refuse("--node_rank", "node ranks follow the host list's order");
  if (given.rdzv_endpoint) {
    refuse("--rdzv_endpoint", "this ddprun hosts the job's store (or node 0 does, with --master_addr)");
  }
  if (given.standalone) refuse("--standalone", "--standalone is for a single node");
  if (o.remote.agent_stdin) refuse("--agent_stdin", "an agent started by a launching ddprun does not launch");
}

}  // namespace

std::vector<std::string> split_shell_words(const std::string& flag, const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  auto bad = [&](const std::string& why) { throw UsageError("invalid " + flag + " '" + text + "': " + why); };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      auto close = text.find('\'', i + 1);
      if (close == std::string::npos) bad("a ' is not closed");
      word += text.substr(i + 1, close - i - 1);
      i = close;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= text.size()) bad("a \" is not closed");
        if (text[i] == '"') break;
        if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '"' || text[i + 1] == '\\')) ++i;
        word += text[i];
      }
    } else if (c == '\\') {
      if (++i >= text.size()) bad("it ends in a backslash");
      word += text[i];
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

void apply_remote_flags(const RemoteFlags& raw, const NodeFlagsGiven& given, LaunchOptions& o) {
  if (!raw.local_addr.empty()) {
    if (has_blank_or_control(raw.local_addr)) {
      throw UsageError("invalid --local_addr '" + raw.local_addr + "': expected a host name or IP address");
    }
    o.local_addr = raw.local_addr;
  }
  if (!raw.hostfile.empty() && !raw.hosts.empty()) {
    throw UsageError("--hostfile and --hosts cannot be used together: give one host list");
  }
  if (!raw.include.empty() && !raw.exclude.empty()) {
    throw UsageError("--include and --exclude cannot be used together: name the hosts and GPUs to keep with --include");
  }
  if (raw.hostfile.empty() && raw.hosts.empty()) {
    refuse_without_host_list(raw);
    return;
  }
  refuse_node_flags(raw.hostfile.empty() ? "--hosts" : "--hostfile", given, o);

  RemoteOptions& r = o.remote;
  if (!raw.hostfile.empty()) r.hostfile = raw.hostfile;
  if (!raw.hosts.empty()) r.hosts = raw.hosts;
  if (!raw.include.empty()) r.include = raw.include;
  if (!raw.exclude.empty()) r.exclude = raw.exclude;
  if (!raw.env_file.empty()) r.env_file = raw.env_file;
  r.exports = raw.exports;
  if (!raw.remote_ddprun.empty()) {
    if (raw.remote_ddprun.front() != '/' || raw.remote_ddprun.find('\n') != std::string::npos) {
      throw UsageError("invalid --remote_ddprun '" + raw.remote_ddprun +
                       "': expected the absolute path of ddprun on the hosts");
    }
    r.remote_ddprun = raw.remote_ddprun;
  }
  r.ssh_command = ssh_base_command();
  if (!raw.ssh_args.empty()) {
    auto words = split_shell_words("--ssh_args", raw.ssh_args);
    if (words.empty()) throw UsageError("invalid --ssh_args '" + raw.ssh_args + "': no arguments in it");
    r.ssh_command.insert(r.ssh_command.end(), words.begin(), words.end());
  }
}

}  // namespace ddprun
