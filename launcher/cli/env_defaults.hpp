// Flag defaults from the environment, torchrun's way: a flag not on the command line
// takes its value from PET_<NAME>, where NAME is the flag's first long spelling in
// upper case with '-' as '_' (--nproc_per_node: PET_NPROC_PER_NODE). On/off flags read
// an integer: 0 is off, any other integer on. Kubernetes operators (Kubeflow's
// training-operator, Trainer v2) configure torchrun this way.
//
// Precedence: the command line, then PET_*, then a Slurm step (slurm_env.hpp), then the
// flag's default. A value from PET_* counts as given, so Slurm does not replace it.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ddprun {

// Where the value of one flag came from.
struct FlagSource {
  std::string flag;                    // the first long spelling, e.g. "--nnodes"
  std::vector<std::string> spellings;  // every long spelling, e.g. "--node_rank", "--node-rank"
  std::string variable;                // "PET_NNODES", or empty: the command line
  std::string value;                   // the text given (an on/off flag's: the variable's, if any)
  bool on_off = false;                 // an on/off flag, turned on
};

class EnvDefaults {
 public:
  // For every option of `app` with a long name that was not on the command line (help,
  // version and hidden options aside): reads PET_<NAME> and, when set, adds its value
  // to the option as if it were given, so app.count() counts it. An empty value is the
  // same as unset where the flag's default is empty. Call after app.parse(). Throws
  // UsageError naming the variable for an on/off flag that is not an integer, and for
  // an empty value where the flag has a default.
  static EnvDefaults apply(CLI::App& app);

  // One line per value given on the command line or by PET_*, and one per PET_* that the
  // command line overrode or that turned an on/off flag off (for -v).
  std::vector<std::string> notes() const;

  // `message` (an error about the flags) rewritten to name the variable where it is about
  // a value that came from PET_*: "invalid --nnodes '0': ..." becomes "invalid PET_NNODES
  // '0' (from the environment, for --nnodes): ..."; another message that names such a
  // flag gets "(from the environment: --nnodes is PET_NNODES=2)" added.
  std::string explain(const std::string& message) const;

 private:
  static EnvDefaults command_line_only(CLI::App& app);  // what the command line gave

  std::vector<FlagSource> given_;     // values in effect from the command line or PET_*
  std::vector<std::string> unused_;   // PET_* that changed nothing, and why
};

// "PET_" + the flag's first long name (without dashes) in upper case, '-' as '_'.
std::string env_default_variable(const std::string& long_name);

// PET_* for an on/off flag, as torchrun reads it (Python's int()): an integer with an
// optional sign and blanks around it; 0 is off, anything else on. Nothing when the
// text is not an integer.
std::optional<bool> env_flag_value(const std::string& text);

}  // namespace ddprun
