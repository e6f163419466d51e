// Environment variables set or unset for the scope of a unit test, restored after it,
// for the launcher code that reads this process's environment (DDPRUN_SSH, the
// variables sent to every host, Slurm's step variables).
#pragma once

#include <stdlib.h>

#include <map>
#include <optional>
#include <string>

namespace testing {

class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) put(name, value);
  }

  // Sets `name` to `value` (nullopt: unsets it); the first call for a name saves its value.
  void set(const std::string& name, const std::optional<std::string>& value) {
    if (!saved_.count(name)) {
      const char* old = getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    put(name, value);
  }

 private:
  static void put(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace testing
