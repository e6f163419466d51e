// torchrun 2.x's newer flags on ddprun's command line: both spellings, torchrun's
// values and defaults, the variables they fall back to, and one clear error each.
#include <catch2/catch.hpp>
#include <signal.h>

#include "cli/torchrun_flags.hpp"
#include "command_line.hpp"
#include "remote/agent_command.hpp"
#include "scoped_env.hpp"

using command_line::flags_error;
using command_line::parse_flags;
using ddprun::NumaBinding;

TEST_CASE("numa_binding takes torchrun's four modes in both spellings", "[options][torchrun]") {
  CHECK(parse_flags({}).numa_binding == NumaBinding::None);
  CHECK(parse_flags({"--numa-binding=node"}).numa_binding == NumaBinding::Node);
  CHECK(parse_flags({"--numa_binding", "socket"}).numa_binding == NumaBinding::Socket);
  CHECK(parse_flags({"--numa-binding", "exclusive"}).numa_binding == NumaBinding::Exclusive);
  CHECK(parse_flags({"--numa-binding", "core-complex"}).numa_binding == NumaBinding::CoreComplex);
  CHECK(flags_error({"--numa-binding", "core_complex"}) ==
        "invalid --numa_binding 'core_complex': expected node, socket, exclusive or core-complex");
}

TEST_CASE("virtual_local_rank and run_path are on/off flags", "[options][torchrun]") {
  auto o = parse_flags({"--virtual-local-rank", "--run_path"});
  CHECK(o.virtual_local_rank);
  CHECK(o.run_path);
  auto d = parse_flags({});
  CHECK_FALSE(d.virtual_local_rank);
  CHECK_FALSE(d.run_path);
}

TEST_CASE("duplicate filters split at each comma and a doubled comma stands for one", "[options][torchrun]") {
  auto o = parse_flags({"--duplicate-stdout-filters", "apple,orange", "--duplicate_stderr_filters=a,,b,c"});
  CHECK(o.duplicate_stdout_filters == std::vector<std::string>{"apple", "orange"});
  CHECK(o.duplicate_stderr_filters == std::vector<std::string>{"a,b", "c"});
  CHECK(ddprun::split_filter_list("x,,,y") == std::vector<std::string>{"x,", "y"});
  CHECK(parse_flags({}).duplicate_stdout_filters.empty());
}

TEST_CASE("the line prefix template comes from the flag or else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
          "[options][torchrun]") {
  testing::ScopedEnv env;
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", std::nullopt);
  CHECK_FALSE(parse_flags({}).log_line_prefix_template.has_value());
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}> ");
  CHECK(parse_flags({}).log_line_prefix_template == "${rank}> ");
  CHECK(parse_flags({"--log-line-prefix-template", "${hostname}:"}).log_line_prefix_template == "${hostname}:");
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "a\nb");
  CHECK(flags_error({}) == "invalid TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE 'a\nb': expected a template without line "
                           "breaks");
}

TEST_CASE("signals_to_handle names the signals that stop the job", "[options][torchrun]") {
  auto d = parse_flags({});
  CHECK(d.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  CHECK(d.handled_signals.empty());
  auto o = parse_flags({"--signals-to-handle", "SIGTERM, SIGUSR1,SIGUSR2"});
  CHECK(o.signals_to_handle == "SIGTERM, SIGUSR1,SIGUSR2");
  CHECK(o.handled_signals == std::vector<int>{SIGTERM, SIGUSR1, SIGUSR2});
  CHECK_THAT(flags_error({"--signals_to_handle", "SIGTERM,SIGKILL"}),
             Catch::StartsWith("invalid --signals_to_handle 'SIGTERM,SIGKILL': SIGKILL cannot be caught"));
  CHECK_THAT(flags_error({"--signals_to_handle", "SIGCHLD"}), Catch::Contains("watches its workers with SIGCHLD"));
  CHECK_THAT(flags_error({"--signals_to_handle", "TERM"}), Catch::Contains("'TERM' is not a signal"));
}

TEST_CASE("shutdown_timeout is the grace period and the flags win over TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
          "[options][torchrun]") {
  testing::ScopedEnv env;
  env.set("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", std::nullopt);
  CHECK(parse_flags({}).grace_period == 30.0);
  CHECK(parse_flags({"--shutdown-timeout", "5"}).grace_period == 5.0);
  CHECK(parse_flags({"--shutdown_timeout=0"}).grace_period == 0.0);
  CHECK(parse_flags({"--shutdown-timeout", "5", "--grace_period", "5"}).grace_period == 5.0);
  CHECK(flags_error({"--shutdown-timeout", "5", "--grace_period", "6"}) ==
        "--shutdown_timeout 5 and --grace_period disagree: both are the seconds between the stop signal and SIGKILL; "
        "give one");
  CHECK(flags_error({"--shutdown-timeout", "1.5"}) == "invalid --shutdown_timeout '1.5': expected a whole number of "
                                                      "seconds >= 0");
  CHECK_THAT(flags_error({"--shutdown-timeout", "-1"}), Catch::StartsWith("invalid --shutdown_timeout '-1'"));
  env.set("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7");
  CHECK(parse_flags({}).grace_period == 7.0);
  CHECK(parse_flags({"--grace_period", "2"}).grace_period == 2.0);
  CHECK(parse_flags({"--shutdown_timeout", "3"}).grace_period == 3.0);
  env.set("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon");
  CHECK(flags_error({}) == "invalid TORCH_ELASTIC_SHUTDOWN_TIMEOUT 'soon': expected a whole number of seconds >= 0");
}

TEST_CASE("start_method and event_log_handler and logs_specs are checked and noted", "[options][torchrun]") {
  CHECK(parse_flags({}).torchrun_notes.empty());
  auto o = parse_flags({"--start-method", "forkserver", "--event_log_handler=console", "--logs-specs", "mine"});
  REQUIRE(o.torchrun_notes.size() == 3);
  CHECK_THAT(o.torchrun_notes[0], Catch::StartsWith("--start_method forkserver has no effect: "));
  CHECK_THAT(o.torchrun_notes[1], Catch::StartsWith("--event_log_handler console has no effect: "));
  CHECK_THAT(o.torchrun_notes[2], Catch::StartsWith("--logs_specs mine has no effect: "));
  CHECK(flags_error({"--start_method", "thread"}) ==
        "invalid --start_method 'thread': expected spawn, fork or forkserver");
  CHECK(flags_error({"--event-log-handler", "file"}) ==
        "invalid --event_log_handler 'file': expected null, console or dynamic_rendezvous");
  CHECK_THAT(flags_error({"--logs_specs", "a b"}), Catch::StartsWith("invalid --logs_specs 'a b'"));
}

TEST_CASE("nproc_per_node takes xpu", "[options][torchrun]") {
  CHECK(parse_flags({"--nproc-per-node", "xpu"}).nproc_per_node == "xpu");
  CHECK_THAT(flags_error({"--nproc-per-node", "tpu"}), Catch::Contains("gpu, xpu, cpu or auto"));
}

TEST_CASE("an agent of a --hosts launch gets the same values of the newer flags", "[options][torchrun][remote]") {
  testing::ScopedEnv env;
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${hostname}> ");  // the agents are told it as a flag
  auto l = command_line::parse({"--hosts", "a:2,b:2", "--numa-binding", "core-complex", "--virtual-local-rank",
                                "--duplicate-stdout-filters", "a,,b,c", "--duplicate-stderr-filters", "E",
                                "--signals-to-handle", "SIGTERM,SIGUSR1", "--shutdown-timeout", "4", "--run-path",
                                "/abs/train.py"});
  ddprun::AgentPlace place;
  place.nnodes = 2;
  place.nproc_per_node = "2";
  place.run_id = "job";
  place.store_endpoint = "10.0.0.1:4242";
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", std::nullopt);
  auto a = command_line::parse(ddprun::agent_arguments(l, place));
  CHECK(a.numa_binding == NumaBinding::CoreComplex);
  CHECK(a.virtual_local_rank);
  CHECK(a.duplicate_stdout_filters == std::vector<std::string>{"a,b", "c"});
  CHECK(a.duplicate_stderr_filters == std::vector<std::string>{"E"});
  CHECK(a.log_line_prefix_template == "${hostname}> ");
  CHECK(a.handled_signals == std::vector<int>{SIGTERM, SIGUSR1});
  CHECK(a.grace_period == 4.0);
  CHECK(a.run_path);
  CHECK(ddprun::torchrun_flag_arguments(command_line::parse_flags({})).empty());
}
