// Definition and validation of torchrun 2.x's newer flags (torchrun_flags.hpp).
#include "cli/torchrun_flags.hpp"

#include <CLI/CLI.hpp>
#include <signal.h>

#include <cstdlib>
#include <utility>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"

namespace ddprun {
namespace {

constexpr const char* kDefaultSignals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
constexpr long long kMaxSeconds = 86400LL * 365;

// The signals a launcher can sensibly catch and pass on: asynchronous ones whose
// default action ends a process. KILL and STOP cannot be caught; CHLD is how ddprun
// watches its workers; the rest (SEGV, FPE, ...) only come from a fault of ddprun itself.
constexpr std::pair<const char*, int> kHandledSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},       {"SIGQUIT", SIGQUIT}, {"SIGTERM", SIGTERM},
    {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},     {"SIGALRM", SIGALRM}, {"SIGVTALRM", SIGVTALRM},
    {"SIGPROF", SIGPROF}, {"SIGXCPU", SIGXCPU},     {"SIGXFSZ", SIGXFSZ}, {"SIGPWR", SIGPWR},
};

[[noreturn]] void invalid(const std::string& flag, const std::string& value, const std::string& expected) {
  throw UsageError("invalid " + flag + " '" + value + "': " + expected);
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

constexpr NumaBinding kNumaModes[] = {NumaBinding::Node, NumaBinding::Socket, NumaBinding::Exclusive,
                                       NumaBinding::CoreComplex};

NumaBinding numa_mode(const std::string& text) {
  for (NumaBinding mode : kNumaModes) {
    if (text == numa_binding_name(mode)) return mode;
  }
  invalid("--numa_binding", text, "expected node, socket, exclusive or core-complex");
}

std::vector<int> parse_signals(const std::string& text) {
  std::vector<int> signals;
  std::string_view rest = text;
  while (true) {
    auto comma = rest.find(',');
    std::string name = trim(std::string(rest.substr(0, comma)));
    int sig = handled_signal_number(name);
    if (sig == 0) {
      std::string why = name == "SIGKILL" || name == "SIGSTOP" ? name + " cannot be caught"
                        : name == "SIGCHLD"                    ? "ddprun watches its workers with SIGCHLD"
                                                               : "'" + name + "' is not a signal ddprun can handle";
      invalid("--signals_to_handle", text,
              why + "; expected names such as SIGTERM,SIGUSR1 (SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, "
                    "SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGPWR)");
    }
    signals.push_back(sig);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return signals;
}

// --shutdown_timeout (or TORCH_ELASTIC_SHUTDOWN_TIMEOUT): whole seconds >= 0, as torchrun's int.
double shutdown_seconds(const std::string& what, const std::string& text) {
  auto n = ddp::contract::parse_integer(trim(text));
  if (!n || *n < 0 || *n > kMaxSeconds) invalid(what, text, "expected a whole number of seconds >= 0");
  return static_cast<double>(*n);
}

void apply_grace(const TorchrunFlags& raw, bool grace_period_given, LaunchOptions& o) {
  if (!raw.shutdown_timeout.empty()) {
    double seconds = shutdown_seconds("--shutdown_timeout", raw.shutdown_timeout);
    if (grace_period_given && seconds != o.grace_period) {
      throw UsageError("--shutdown_timeout " + raw.shutdown_timeout + " and --grace_period disagree: both are the " +
                       "seconds between the stop signal and SIGKILL; give one");
    }
    o.grace_period = seconds;
  } else if (const char* env = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); env != nullptr && !grace_period_given) {
    o.grace_period = shutdown_seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", env);
  }
}

void apply_accepted(const TorchrunFlags& raw, LaunchOptions& o) {
  if (!raw.start_method.empty()) {
    if (raw.start_method != "spawn" && raw.start_method != "fork" && raw.start_method != "forkserver") {
      invalid("--start_method", raw.start_method, "expected spawn, fork or forkserver");
    }
    o.torchrun_notes.push_back("--start_method " + raw.start_method +
                               " has no effect: ddprun execs every worker as a new program, which is spawn's "
                               "fresh interpreter; there is no Python parent to fork from");
  }
  if (!raw.event_log_handler.empty()) {
    if (raw.event_log_handler != "null" && raw.event_log_handler != "console" &&
        raw.event_log_handler != "dynamic_rendezvous") {
      invalid("--event_log_handler", raw.event_log_handler, "expected null, console or dynamic_rendezvous");
    }
    o.torchrun_notes.push_back("--event_log_handler " + raw.event_log_handler +
                               " has no effect: torchrun's event handlers are Python logging handlers; ddprun "
                               "writes its events to its own log on stderr");
  }
  if (!raw.logs_specs.empty()) {
    if (raw.logs_specs.find_first_of(" \t\n") != std::string::npos) {
      invalid("--logs_specs", raw.logs_specs, "expected the name of a torchrun.logs_specs entry point");
    }
    o.torchrun_notes.push_back("--logs_specs " + raw.logs_specs +
                               " has no effect: a torchrun.logs_specs entry point is a Python class ddprun cannot "
                               "load; logs follow --log_dir, --redirects and --tee");
  }
}

}  // namespace

std::vector<std::string> split_filter_list(const std::string& text) {
  std::vector<std::string> items(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      items.back() += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      items.back() += ',';
      ++i;
    } else {
      items.emplace_back();
    }
  }
  return items;
}

const char* numa_binding_name(NumaBinding mode) {
  switch (mode) {
    case NumaBinding::Node: return "node";
    case NumaBinding::Socket: return "socket";
    case NumaBinding::Exclusive: return "exclusive";
    case NumaBinding::CoreComplex: return "core-complex";
    case NumaBinding::None: break;
  }
  return "none";
}

std::vector<std::string> torchrun_flag_arguments(const LaunchOptions& o) {
  std::vector<std::string> args;
  auto filters = [](const std::vector<std::string>& items) {
    std::string text;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) text += ',';
      for (char c : items[i]) text += c == ',' ? std::string(",,") : std::string(1, c);
    }
    return text;
  };
  if (o.numa_binding != NumaBinding::None) {
    args.insert(args.end(), {"--numa_binding", numa_binding_name(o.numa_binding)});
  }
  if (o.virtual_local_rank) args.push_back("--virtual_local_rank");
  if (!o.duplicate_stdout_filters.empty()) {
    args.insert(args.end(), {"--duplicate_stdout_filters", filters(o.duplicate_stdout_filters)});
  }
  if (!o.duplicate_stderr_filters.empty()) {
    args.insert(args.end(), {"--duplicate_stderr_filters", filters(o.duplicate_stderr_filters)});
  }
  if (o.log_line_prefix_template) args.insert(args.end(), {"--log_line_prefix_template", *o.log_line_prefix_template});
  if (o.signals_to_handle != kDefaultSignals) args.insert(args.end(), {"--signals_to_handle", o.signals_to_handle});
  if (o.run_path) args.push_back("--run_path");
  return args;
}

int handled_signal_number(const std::string& name) {
  for (auto [known, sig] : kHandledSignals) {
    if (name == known) return sig;
  }
  return 0;
}

void add_torchrun_flags(CLI::App& app, TorchrunFlags& raw) {
  app.add_option("--numa_binding,--numa-binding", raw.numa_binding,
                 "Bind each worker to CPUs near its GPU (no GPU: its share of the NUMA nodes): node, socket, "
                 "exclusive or core-complex, as torchrun's modes; memory is preferred from that NUMA node")
      ->type_name("MODE");
  app.add_flag("--virtual_local_rank,--virtual-local-rank", raw.virtual_local_rank,
               "LOCAL_RANK=0 in every worker, and each worker sees only its own GPU (CUDA_VISIBLE_DEVICES)");
  app.add_option("--duplicate_stdout_filters,--duplicate-stdout-filters", raw.duplicate_stdout_filters,
                 "Also write workers' stdout lines holding any of these strings (comma-separated, ',,' for a "
                 "comma) to <log dir>/<run_id>/attempt_<k>/filtered_stdout.log, prefixed")
      ->type_name("LIST");
  app.add_option("--duplicate_stderr_filters,--duplicate-stderr-filters", raw.duplicate_stderr_filters,
                 "As --duplicate_stdout_filters, for stderr (filtered_stderr.log)")
      ->type_name("LIST");
  app.add_option("--log_line_prefix_template,--log-line-prefix-template", raw.log_line_prefix_template,
                 "Prefix of each worker line on the console instead of [rankN]: with ${rank}, ${local_rank}, "
                 "${role_name} and ${hostname} (else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)")
      ->type_name("TEMPLATE");
  app.add_option("--signals_to_handle,--signals-to-handle", raw.signals_to_handle,
                 "Signals that, sent to ddprun, go to the workers and stop the job (SIGINT, SIGTERM, SIGHUP and "
                 "SIGQUIT always do; SIGUSR1/2 not listed are only passed on); workers get the list as "
                 "TORCHELASTIC_SIGNALS_TO_HANDLE")
      ->default_str(kDefaultSignals);
  app.add_option("--shutdown_timeout,--shutdown-timeout", raw.shutdown_timeout,
                 "torchrun's name for --grace_period (whole seconds); else TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
      ->type_name("SECONDS");
  app.add_flag("--run_path,--run-path", raw.run_path,
               "Run PROGRAM (a Python file) with runpy.run_path under the interpreter, as torchrun does; "
               "wins over --no_python and --module");
  app.add_option("--start_method,--start-method", raw.start_method,
                 "Accepted for torchrun compatibility (spawn, fork, forkserver): ddprun execs every worker")
      ->default_str("spawn");
  app.add_option("--event_log_handler,--event-log-handler", raw.event_log_handler,
                 "Accepted for torchrun compatibility (null, console, dynamic_rendezvous); no effect")
      ->default_str("null");
  app.add_option("--logs_specs,--logs-specs", raw.logs_specs,
                 "Accepted for torchrun compatibility (a Python entry point name); no effect")
      ->type_name("NAME");
}

void apply_torchrun_flags(const TorchrunFlags& raw, bool grace_period_given, LaunchOptions& o) {
  if (!raw.numa_binding.empty()) o.numa_binding = numa_mode(raw.numa_binding);
  o.virtual_local_rank = raw.virtual_local_rank;
  if (!raw.duplicate_stdout_filters.empty()) o.duplicate_stdout_filters = split_filter_list(raw.duplicate_stdout_filters);
  if (!raw.duplicate_stderr_filters.empty()) o.duplicate_stderr_filters = split_filter_list(raw.duplicate_stderr_filters);

  std::string prefix = raw.log_line_prefix_template;
  std::string prefix_source = "--log_line_prefix_template";
  if (prefix.empty()) {
    const char* env = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    if (env != nullptr) prefix = env;
    prefix_source = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
  }
  if (prefix.find_first_of("\r\n") != std::string::npos) {
    invalid(prefix_source, prefix, "expected a template without line breaks");
  }
  if (!prefix.empty()) o.log_line_prefix_template = prefix;

  if (!raw.signals_to_handle.empty()) {
    o.handled_signals = parse_signals(raw.signals_to_handle);
    o.signals_to_handle = raw.signals_to_handle;
  }
  apply_grace(raw, grace_period_given, o);
  o.run_path = raw.run_path;
  apply_accepted(raw, o);
}

}  // namespace ddprun
