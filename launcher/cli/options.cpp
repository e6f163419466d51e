#include "cli/options.hpp"

#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "errors.hpp"
#include "ddp/contract/parse.hpp"
#include "cli/completion.hpp"
#include "cli/env_defaults.hpp"
#include "cli/rdzv_conf.hpp"
#include "cli/remote_flags.hpp"
#include "cli/slurm_env.hpp"
#include "cli/torchrun_flags.hpp"
#include "rdzv/store.hpp"
#include "ddp/contract/worker_env.hpp"
#include "rdzv/token.hpp"

namespace ddprun {
namespace {

// Every flag is read as text and validated here, so each bad value gets one message
// in the same form: "invalid --flag 'value': what is expected".
struct RawFlags {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  std::string node_rank = "0";
  std::string master_addr = "127.0.0.1";
  std::string master_port;
  bool no_agent_store = false;
  std::string role = "default";
  std::string run_id;
  std::string max_restarts = "0";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  std::string monitor_interval = "0.1";
  std::string grace_period = "30";
  std::string rdzv_endpoint;
  std::string rdzv_backend = "static";
  std::string token_file;
  std::string join_timeout = "600";
  std::string rdzv_conf;
  std::string heartbeat_timeout = "10";
  std::string exit_barrier_timeout = "300";
  std::string stall_timeout = "300";
  std::string stall_action = "report";
  RemoteFlags remote;  // many nodes from one command (remote_flags.hpp), and --local_addr
};

constexpr int kDefaultEndpointPort = 29400;  // torchrun's c10d default

// torchrun's meaning of an endpoint, once Slurm had its say: the run id defaults to
// "none", and a fixed node count without node ranks takes them by arrival. An explicit
// c10d backend ranks by arrival whatever --node_rank says, as torchrun does; the rank
// stays an order hint where it is one.
void apply_endpoint_defaults(bool c10d_backend, LaunchOptions& opts) {
  if (!opts.rdzv_host || opts.remote.agent_stdin) return;  // an agent's launcher gave it every value
  if (opts.run_id.empty()) {
    opts.run_id = "none";
    opts.run_id_defaulted = true;
  }
  if (c10d_backend && opts.node_rank_given) {
    if (opts.node_rank != 0) {
      opts.torchrun_notes.push_back("node_rank is only used for static rdzv_backend. It will be ignored for "
                                    "rdzv_backend=c10d (node ranks follow arrival; it is only an order hint)");
    }
    if (opts.node_rank >= opts.nnodes) {  // ignored, as torchrun does, rather than refused
      opts.node_rank = 0;
      opts.node_rank_given = false;
    }
  }
  opts.ranks_by_arrival = !opts.elastic() && opts.nnodes > 1 && (!opts.node_rank_given || c10d_backend);
}

// torchrun's --standalone sets backend, endpoint and id itself: "any explicitly set
// values are ignored". Said in one line, so a stale PET_RDZV_ENDPOINT is no surprise.
// A given --rdzv_id stays: on one node it only names the log folder and the job for
// `ddprun status`, and scripts rely on that.
void drop_for_standalone(RawFlags& raw, LaunchOptions& opts) {
  std::string dropped;
  auto drop = [&dropped](const std::string& flag, std::string& value, const std::string& reset) {
    if (value == reset) return;
    dropped += (dropped.empty() ? "" : ", ") + flag + "=" + value;
    value = reset;
  };
  drop("--rdzv_endpoint", raw.rdzv_endpoint, "");
  drop("--rdzv_backend", raw.rdzv_backend, "static");
  if (!dropped.empty()) {
    opts.torchrun_notes.push_back("--standalone ignores " + dropped + ", as torchrun's: a local store on a free port");
  }
}

[[noreturn]] void invalid(const std::string& flag, const std::string& value, const std::string& expected) {
  throw UsageError("invalid " + flag + " '" + value + "': " + expected);
}

int integer_in(const std::string& flag, const std::string& text, long long lo, long long hi,
               const std::string& expected) {
  auto n = ddp::contract::parse_integer(text);
  if (!n || *n < lo || *n > hi) invalid(flag, text, expected);
  return static_cast<int>(*n);
}

double seconds_in(const std::string& flag, const std::string& text, bool allow_zero) {
  auto v = seconds_value(text, allow_zero);
  if (!v) invalid(flag, text, allow_zero ? "expected a number of seconds >= 0" : "expected a number of seconds > 0");
  return *v;
}

// --nnodes N, or torchrun's MIN:MAX (N:N is the fixed count N). Sets min_nodes and nnodes (MAX).
void parse_nnodes(const std::string& text, LaunchOptions& opts) {
  auto colon = text.find(':');
  std::string lo = text.substr(0, colon);
  std::string hi = colon == std::string::npos ? lo : text.substr(colon + 1);
  auto a = ddp::contract::parse_integer(lo);
  auto b = ddp::contract::parse_integer(hi);
  if (!a || !b || *a < 1 || *b < *a || *b > 100000) {
    invalid("--nnodes", text, "expected a positive node count N, or MIN:MAX with 1 <= MIN <= MAX");
  }
  opts.min_nodes = static_cast<int>(*a);
  opts.nnodes = static_cast<int>(*b);
}

void validate_nproc(const std::string& text) {
  if (text == "gpu" || text == "xpu" || text == "cpu" || text == "auto") return;
  integer_in("--nproc_per_node", text, 1, 4096, "expected a worker count (1-4096), gpu, xpu, cpu or auto");
}

std::set<int> parse_rank_list(const std::string& text) {
  std::set<int> ranks;
  std::string_view rest = text;
  while (true) {
    auto comma = rest.find(',');
    auto rank = ddp::contract::parse_integer(rest.substr(0, comma));
    if (!rank || *rank < 0 || *rank > 1'000'000) {
      invalid("--local_ranks_filter", text, "expected a comma-separated list of local ranks, e.g. 0 or 0,2");
    }
    ranks.insert(static_cast<int>(*rank));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return ranks;
}

// CLI11 2.1 cannot describe "PROGRAM [ARGS...]" after prefix_command(); say it here.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: ddprun [options] PROGRAM [ARGS...]\n";
  }
};

}  // namespace

// torchrun's parse (parse_rendezvous_endpoint): the port follows the last ':', a
// bracketed [IPv6] may stand alone, and the host is letters, digits, '_', '.', '-' and
// ':'. Stricter where torchrun would only fail at connect time: a host with a ':' must
// be an IPv6 address, and the port 1-65535.
std::pair<std::string, int> parse_endpoint(const std::string& value) {
  constexpr const char* kExpected =
      "expected HOST[:PORT] (PORT 1-65535, 29400 when absent; IPv6 as [ADDR] or [ADDR]:PORT)";
  const auto first = value.find_first_not_of(" \t\n");
  const std::string text =
      first == std::string::npos ? "" : value.substr(first, value.find_last_not_of(" \t\n") - first + 1);
  if (text.empty()) invalid("--rdzv_endpoint", value, kExpected);
  std::string host = text;
  std::optional<std::string> port_text;
  if (!(text.front() == '[' && text.back() == ']')) {
    if (auto colon = text.rfind(':'); colon != std::string::npos) {
      host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
    }
  }
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = kDefaultEndpointPort;
  if (port_text) {
    bool digits = !port_text->empty() && port_text->size() <= 5 &&
                  std::all_of(port_text->begin(), port_text->end(), [](unsigned char c) { return std::isdigit(c); });
    port = digits ? std::stoi(*port_text) : 0;
    if (port < 1 || port > 65535) invalid("--rdzv_endpoint", value, kExpected);
  }
  bool word = !host.empty() && std::all_of(host.begin(), host.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == ':';
  });
  in6_addr v6{};
  if (!word || (host.find(':') != std::string::npos && inet_pton(AF_INET6, host.c_str(), &v6) != 1)) {
    invalid("--rdzv_endpoint", value, kExpected);
  }
  return {host, port};
}

// parse_command_line without the wording of errors about values from PET_*.
static ParsedCommandLine parse_and_check(int argc, const char* const* argv, EnvDefaults& sources) {
  CLI::App app{"ddprun: launch and supervise one worker process per GPU or CPU slot (a torchrun replacement).",
               "ddprun"};
  auto formatter = std::make_shared<UsageFormatter>();
  formatter->column_width(34);
  app.formatter(formatter);
  app.footer(
      "PROGRAM is run as is, or under python3 -u when it ends in .py (PYTHON_EXEC names another\n"
      "interpreter); -m runs a Python module. Everything after PROGRAM goes to the program.\n"
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,\n"
      "ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_* as under torchrun.\n"
      "An option not given takes its value from PET_<OPTION>, as under torchrun (PET_NNODES=2,\n"
      "PET_STANDALONE=1, ...); the command line wins over PET_*, and PET_* over a Slurm step's variables.\n"
      "Exit status: 0 on success; the first failed worker's status (128+N when killed by signal N);\n"
      "128+N when ddprun itself got signal N; 124 when --stall_action=stop ended a stalled job;\n"
      "2 for a bad command line; 1 when the launch cannot start.\n"
      "ddprun status [--run_id ID | --rdzv_endpoint HOST:PORT --rdzv_id ID] [--json] [--watch [S]]\n"
      "shows a running job's ranks (ddprun status --help); \"status\" is a subcommand only as the first\n"
      "argument: run a program named status as ddprun -- status or ddprun ./status.\n"
      "ddprun --hostfile FILE [options] PROGRAM runs the job on every host of FILE from here (ssh keys and\n"
      "the same paths on every host); Ctrl-C stops every host; -v prints what each host is sent.");
  app.prefix_command();  // the first positional is PROGRAM; the rest belongs to it
  app.set_version_flag("--version", std::string("ddprun ") + DDPRUN_VERSION);

  // As with torchrun's argparse, a flag given twice takes its last value.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  RawFlags raw;
  LaunchOptions opts;
  app.add_option("--nproc_per_node,--nproc-per-node", raw.nproc_per_node,
                 "Workers on this node: a number, gpu (one per visible GPU), xpu (one per Intel XPU), cpu (one per usable CPU) "
                 "or auto (gpu if any, else cpu)")->default_str("1");
  app.add_option("--nnodes", raw.nnodes,
                 "Number of nodes: N (one ddprun per node, each with its own --node_rank), or MIN:MAX for an "
                 "elastic job that starts with MAX nodes (or MIN after last_call_timeout), re-forms without a "
                 "node that is lost or leaves (one restart each) and with a node that joins (no restart)")
      ->default_str("1");
  app.add_option("--node_rank,--node-rank", raw.node_rank,
                 "Rank of this node; in an elastic job an order hint (0 without --rdzv_endpoint: hosts the store); "
                 "with --rdzv_endpoint and none given, or with --rdzv_backend=c10d (as torchrun), ranks follow "
                 "the nodes' arrival")
      ->default_str("0");
  app.add_option("--master_addr,--master-addr", raw.master_addr, "Address of node 0, given to workers as MASTER_ADDR")
      ->default_str("127.0.0.1");
  app.add_option("--master_port,--master-port", raw.master_port,
                 "One node: MASTER_PORT, which rank 0 binds; several nodes: the port node 0's rendezvous store "
                 "listens on (the workers get a free port there as MASTER_PORT)")->default_str("29500");
  app.add_flag("--standalone", opts.standalone,
               "Single-node job on a free port chosen by ddprun; ignores --rdzv_endpoint and --rdzv_backend, "
               "as torchrun");
  app.add_flag("--no_agent_store,--no-agent-store", raw.no_agent_store, "Workers host their own store: TORCHELASTIC_USE_AGENT_STORE=False "
               "and MASTER_PORT a port rank 0 binds (default: ddprun's store serves them there, as torchrun's)");
  app.add_option("--role", raw.role, "Role name for the workers (ROLE_NAME)")->default_str("default");
  app.add_option("--rdzv_id,--rdzv-id,--run_id,--run-id", raw.run_id,
                 "Job id (TORCHELASTIC_RUN_ID, log dir name); default: none with --rdzv_endpoint (as torchrun), "
                 "else generated");
  app.add_option("--max_restarts,--max-restarts", raw.max_restarts,
                 "Restart the whole worker group up to this many times after a failure: a worker failing or, in "
                 "an elastic job, a node lost or leaving uses one restart; a node joining uses none")
      ->default_str("0");
  app.add_option("--log_dir,--log-dir", raw.log_dir,
                 "Write each worker's stdout/stderr to DIR/<run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log");
  app.add_option("--redirects,-r", raw.redirects,
                 "Keep streams off the console, log file only: 0 none, 1 stdout, 2 stderr, 3 both, "
                 "or per local rank, e.g. 0:3,1:1")->default_str("0");
  app.add_option("--tee,-t", raw.tee,
                 "Streams written to the log file as well as the console (same values as --redirects)")
      ->default_str("0");
  app.add_option("--local_ranks_filter,--local-ranks-filter", raw.local_ranks_filter,
                 "Only these local ranks' output reaches the console, e.g. 0 or 0,2 (log files keep all)");
  app.add_flag("--no_python,--no-python", opts.no_python, "Run PROGRAM as is, even when it ends in .py");
  app.add_flag("-m,--module", opts.module, "PROGRAM is a Python module, run as python3 -u -m PROGRAM");
  app.add_option("--monitor_interval,--monitor-interval", raw.monitor_interval,
                 "Accepted for torchrun compatibility; ddprun reacts to worker exits at once")->default_str("0.1");
  app.add_option("--grace_period,--grace-period", raw.grace_period,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")->default_str("30");
  app.add_option("--rdzv_endpoint,--rdzv-endpoint", raw.rdzv_endpoint,
                 "HOST[:PORT] (port 29400 when absent) of the job's store, as torchrun's c10d backend: the node "
                 "HOST names (or is_host=true in --rdzv_conf) hosts it there unless a ddp-rendezvous daemon "
                 "already listens there; the others connect (default: node 0 hosts the store on "
                 "--master_addr:--master_port)");
  app.add_option("--rdzv_backend,--rdzv-backend", raw.rdzv_backend,
                 "static, c10d or ddprun: ddprun's store; c10d with --rdzv_endpoint ignores --node_rank, as "
                 "torchrun")
      ->default_str("static");
  app.add_option("--rdzv_token_file,--rdzv-token-file", raw.token_file,
                 "File holding the store's shared token (else DDPRUN_TOKEN; single node: generated)");
  app.add_option("--join_timeout,--join-timeout", raw.join_timeout,
                 "Seconds to wait for every node to join (elastic: for MIN nodes)")->default_str("600");
  app.add_option("--rdzv_conf,--rdzv-conf", raw.rdzv_conf,
                 "torchrun's key=value,... rendezvous settings: join_timeout (or timeout), last_call_timeout "
                 "(default 30: seconds an elastic job waits for MAX after MIN joined), is_host (true or false: "
                 "whether this node hosts the store at --rdzv_endpoint), store_type (tcp); close_timeout, "
                 "heartbeat_timeout, read_timeout, keep_alive_interval, keep_alive_max_attempt, "
                 "cas_backoff_max_seconds and use_agent_store are accepted without effect");
  app.add_option("--heartbeat_timeout,--heartbeat-timeout", raw.heartbeat_timeout,
                 "Seconds after which a node that cannot be reached counts as failed")->default_str("10");
  app.add_option("--exit_barrier_timeout,--exit-barrier-timeout", raw.exit_barrier_timeout,
                 "Seconds a node whose workers finished waits for the other nodes")->default_str("300");
  app.add_option("--stall_timeout,--stall-timeout", raw.stall_timeout,
                 "Seconds without any rank completing a collective (while one waits in it) before ddprun "
                 "prints a stall report with every rank's call and every worker's stacks; 0 turns it off")
      ->default_str("300");
  app.add_option("--stall_action,--stall-action", raw.stall_action,
                 "After a stall report: report (the job goes on) or stop (the job ends with the report as "
                 "its root cause, status 124)")
      ->default_str("report");
  app.add_flag("-v,--verbose", opts.verbose, "Print the launch plan before starting");
  app.add_option("--hostfile", raw.remote.hostfile,
                 "Run the job on every host of FILE from this one command: one ddprun agent per host over ssh "
                 "(a child process for this machine), node ranks in the file's order. Lines 'host slots=N' as "
                 "OpenMPI and DeepSpeed write them, '#' comments; slots is the host's worker count unless "
                 "--nproc_per_node is given")
      ->type_name("FILE");
  app.add_option("--hosts", raw.remote.hosts,
                 "As --hostfile, with the hosts on the command line: h1:4,h2:4 (':N' slots optional; IPv6 as [::1]:2)")
      ->type_name("LIST");
  app.add_option("--include", raw.remote.include,
                 "Keep only these hosts of the host list, and on a host named with indices only those GPUs (its "
                 "CUDA_VISIBLE_DEVICES and worker count): h1:0,2@h2")
      ->type_name("FILTER");
  app.add_option("--exclude", raw.remote.exclude,
                 "Leave out these hosts of the host list, or on a host named with indices only those GPUs: h1:1@h3")
      ->type_name("FILTER");
  app.add_option("--ssh_args,--ssh-args", raw.remote.ssh_args,
                 "Words added to the ssh command, quoted as in a shell, e.g. '-p 2222 -J jumphost' (the environment "
                 "variable DDPRUN_SSH replaces the ssh command itself)")
      ->type_name("ARGS");
  app.add_option("--remote_ddprun,--remote-ddprun", raw.remote.remote_ddprun,
                 "Absolute path of ddprun on the hosts (default: this ddprun's own path)")
      ->type_name("PATH");
  app.add_option("-x", raw.remote.exports,
                 "Send VAR (its value here) or VAR=value to every host; may be repeated. Sent without -x: NCCL_*, "
                 "DDP_*, PYTHON*, OMP_*, CUDA_* (not CUDA_VISIBLE_DEVICES), PATH, LD_LIBRARY_PATH")
      ->type_name("VAR[=VALUE]")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);  // each -x takes one word: "-x A prog" leaves prog the program
  app.add_option("--env_file,--env-file", raw.remote.env_file,
                 "Send the VAR=value lines of FILE to every host ('#' comment lines; 'export ' and quotes allowed); "
                 "-x wins over it")
      ->type_name("FILE");
  app.add_option("--local_addr,--local-addr", raw.remote.local_addr,
                 "The address this node advertises to the other nodes (default: the one that reaches the store); "
                 "with --hostfile, the address the hosts reach this ddprun's store at")
      ->type_name("ADDR");
  app.add_flag("--agent_stdin", opts.remote.agent_stdin)->group("");  // started by a launching ddprun
  TorchrunFlags torchrun;  // torchrun 2.x's newer flags (torchrun_flags.hpp)
  add_torchrun_flags(app, torchrun);
  std::string completion_shell;
  app.add_option("--print_completion,--print-completion", completion_shell,
                 "Print a completion script for bash, zsh or tcsh and exit, as torchrun's "
                 "(source <(ddprun --print-completion bash))")
      ->check(CLI::IsMember(kCompletionShells))
      ->type_name("SHELL")
      ->configurable(false);  // not from PET_PRINT_COMPLETION: torchrun does not read it either

  try {
    app.parse(argc, const_cast<char**>(argv));
  } catch (const CLI::Success& e) {  // --help or --version
    app.exit(e, std::cout, std::cerr);
    return {};
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  if (!completion_shell.empty()) {
    std::cout << completion_script(app, completion_shell);
    return {};
  }
  // PET_* fill in what the command line left open; an agent started by a launching
  // ddprun got every value from it as a flag.
  if (!opts.remote.agent_stdin) sources = EnvDefaults::apply(app);
  opts.agent_store = !raw.no_agent_store;
  opts.value_notes = sources.notes();

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());  // "ddprun [options] -- PROGRAM"
  // CLI11 reads "--flag=" (empty value) as "--flag" and takes the next word as the
  // value; an empty value is never valid for ddprun, so refuse it by name.
  for (int i = 1; i < argc - static_cast<int>(rest.size()); ++i) {
    std::string_view arg = argv[i];
    if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '=') {
      throw UsageError("empty value for " + std::string(arg.substr(0, arg.size() - 1)));
    }
  }
  if (rest.empty()) throw UsageError("no program given: usage is ddprun [options] PROGRAM [ARGS...]");
  if (rest.front().size() > 1 && rest.front()[0] == '-') {
    throw UsageError("unknown option '" + rest.front() + "' (ddprun --help lists the options)");
  }
  opts.program = rest.front();
  opts.program_args.assign(rest.begin() + 1, rest.end());
  if (opts.program.empty()) throw UsageError("the program name is empty");

  if (opts.standalone) drop_for_standalone(raw, opts);
  validate_nproc(raw.nproc_per_node);
  opts.nproc_per_node = raw.nproc_per_node;
  opts.nproc_per_node_given = app.count("--nproc_per_node") > 0;
  parse_nnodes(raw.nnodes, opts);
  opts.node_rank = integer_in("--node_rank", raw.node_rank, 0, 100000, "expected a node rank in [0, nnodes)");
  opts.node_rank_given = app.count("--node_rank") > 0;
  if (raw.master_addr.empty() || raw.master_addr.find_first_of(" \t\n") != std::string::npos) {
    invalid("--master_addr", raw.master_addr, "expected a host name or IP address");
  }
  opts.master_addr = raw.master_addr;
  if (!raw.master_port.empty()) {
    opts.master_port = integer_in("--master_port", raw.master_port, 1, 65535, "expected a port in 1-65535");
  }
  if (raw.role.empty() || raw.role.find_first_of("\n=") != std::string::npos) {
    invalid("--role", raw.role, "expected a non-empty name without '=' or newlines");
  }
  opts.role = raw.role;
  if (!raw.run_id.empty()) {
    if (auto error = rdzv::job_id_error("--rdzv_id", raw.run_id)) throw UsageError(*error);
  }
  opts.run_id = raw.run_id;
  opts.max_restarts = integer_in("--max_restarts", raw.max_restarts, 0, 1'000'000, "expected a count >= 0");
  if (!raw.log_dir.empty()) opts.log_dir = raw.log_dir;
  opts.redirects = StreamSpec::parse("--redirects", raw.redirects);
  opts.tee = StreamSpec::parse("--tee", raw.tee);
  if (!raw.local_ranks_filter.empty()) opts.local_ranks_filter = parse_rank_list(raw.local_ranks_filter);
  opts.monitor_interval = seconds_in("--monitor_interval", raw.monitor_interval, true);
  opts.grace_period = seconds_in("--grace_period", raw.grace_period, true);
  apply_torchrun_flags(torchrun, app.count("--grace_period") > 0, opts);
  if (opts.module && opts.no_python) throw UsageError("--module and --no_python cannot be used together");

  if (opts.nnodes == 1 && !raw.rdzv_endpoint.empty() && raw.rdzv_endpoint.size() > 2 &&
      raw.rdzv_endpoint.compare(raw.rdzv_endpoint.size() - 2, 2, ":0") == 0) {
    // torchrun's single-node recipe (--rdzv_endpoint=localhost:0): a free port, like --standalone.
    opts.standalone = true;
  } else if (!raw.rdzv_endpoint.empty()) {
    auto [host, port] = parse_endpoint(raw.rdzv_endpoint);
    opts.rdzv_host = host;
    opts.rdzv_port = port;
  }
  if (raw.rdzv_backend != "static" && raw.rdzv_backend != "c10d" && raw.rdzv_backend != "ddprun") {
    invalid("--rdzv_backend", raw.rdzv_backend, "expected static, c10d or ddprun");
  }
  try {
    opts.token = rdzv::configured_token(raw.token_file);
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(e.what());
  }
  opts.join_timeout = seconds_in("--join_timeout", raw.join_timeout, false);
  RdzvConf conf = parse_rdzv_conf(raw.rdzv_conf);
  if (conf.join_timeout && app.count("--join_timeout") == 0) opts.join_timeout = *conf.join_timeout;  // the flag wins
  if (conf.last_call_timeout) {
    opts.last_call_timeout = *conf.last_call_timeout;
    if (!opts.elastic()) conf.notes.push_back("--rdzv_conf last_call_timeout has no effect: --nnodes is a fixed count");
  }
  if (conf.store_type) {
    // --standalone has reset the backend to static; it is torchrun's c10d all the same.
    const bool read = opts.standalone || raw.rdzv_backend != "static";
    if (auto note = judge_store_type(*conf.store_type, read)) conf.notes.push_back(*note);
  }
  opts.rdzv_is_host = conf.is_host;
  if (conf.is_host && !opts.rdzv_host) {
    conf.notes.push_back("--rdzv_conf is_host has no effect: without --rdzv_endpoint node 0 hosts the store");
  }
  opts.rdzv_conf_notes = std::move(conf.notes);
  opts.heartbeat_timeout = seconds_in("--heartbeat_timeout", raw.heartbeat_timeout, false);
  if (opts.heartbeat_timeout < 2) invalid("--heartbeat_timeout", raw.heartbeat_timeout, "expected at least 2 seconds");
  opts.exit_barrier_timeout = seconds_in("--exit_barrier_timeout", raw.exit_barrier_timeout, false);
  opts.stall_timeout = seconds_in("--stall_timeout", raw.stall_timeout, true);
  if (raw.stall_action != "report" && raw.stall_action != "stop") {
    invalid("--stall_action", raw.stall_action, "expected report or stop");
  }
  opts.stall_stop = raw.stall_action == "stop";
  try {
    opts.wait_notice_every = ddp::contract::wait_notice_every(ddp::contract::Variables::from_process());
  } catch (const ddp::contract::ContractError& e) {
    throw UsageError(e.what());
  }

  NodeFlagsGiven node_flags;
  node_flags.nnodes = app.count("--nnodes") > 0;
  node_flags.node_rank = app.count("--node_rank") > 0;
  node_flags.rdzv_endpoint = !raw.rdzv_endpoint.empty();
  node_flags.standalone = opts.standalone;
  apply_remote_flags(raw.remote, node_flags, opts);

  // Inside `srun ddprun ...`, Slurm fills in what the flags left open; not for a
  // launching ddprun (the host list decides every node) nor for the agents it starts
  // (their launcher gave them every value).
  ExplicitFlags given;
  given.nnodes = app.count("--nnodes") > 0;
  given.node_rank = app.count("--node_rank") > 0;
  given.master_addr = app.count("--master_addr") > 0;
  given.master_port = app.count("--master_port") > 0 || opts.standalone;
  given.run_id = !opts.run_id.empty();
  if (!opts.remote.launching() && !opts.remote.agent_stdin) opts.slurm_notes = apply_slurm_step(opts, given);
  opts.master_addr_given = given.master_addr;
  apply_endpoint_defaults(raw.rdzv_backend == "c10d", opts);
  // torchrun 2.x's switch for its c10d rendezvous (--standalone is one too): the workers
  // host their own store, as with --no_agent_store.
  if (opts.agent_store && (raw.rdzv_backend == "c10d" || opts.standalone) && !opts.remote.agent_stdin) {
    if (const char* v = std::getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE"); v && std::string_view(v) == "1") {
      opts.agent_store = false;
      opts.torchrun_notes.push_back("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers host their own store "
                                    "(TORCHELASTIC_USE_AGENT_STORE=False), as torchrun's c10d rendezvous does");
    }
  }
  if (opts.standalone && opts.elastic()) {
    throw UsageError("--standalone (or --rdzv_endpoint=HOST:0) is for single-node jobs; --nnodes " +
                     std::to_string(opts.min_nodes) + ":" + std::to_string(opts.nnodes) + " is an elastic job");
  }
  if (opts.standalone && opts.nnodes > 1) {
    throw UsageError(std::string("--standalone (or --rdzv_endpoint=HOST:0) is for single-node jobs; this is ") +
                     std::to_string(opts.nnodes) + " nodes" + (opts.slurm_notes.empty() ? "" : " (from Slurm)"));
  }
  if (opts.node_rank >= opts.nnodes) {
    invalid("--node_rank", std::to_string(opts.node_rank),
            "expected a node rank in [0, nnodes) with nnodes=" + std::to_string(opts.nnodes) +
                (opts.elastic() ? " (MAX of " + std::to_string(opts.min_nodes) + ":" + std::to_string(opts.nnodes) + ")"
                                : ""));
  }
  return {std::move(opts)};
}

ParsedCommandLine parse_command_line(int argc, const char* const* argv) {
  EnvDefaults sources;
  try {
    return parse_and_check(argc, argv, sources);
  } catch (const UsageError& e) {
    throw UsageError(sources.explain(e.what()));
  } catch (const LaunchError& e) {
    throw LaunchError(sources.explain(e.what()));
  }
}

}  // namespace ddprun
