// The keys that store clients prove they know (see src/auth.hpp for the
// challenge-response): generating a shared token, reading one from a file, and
// deriving a job's credential from a store daemon's secret.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace rdzv {

// 32 random bytes as 64 hex characters.
std::string generate_token();

// A token file's first line without surrounding whitespace. Throws StoreError
// naming the file (as a `kind` file: "token", "secret") when it cannot be read or is empty.
std::string read_token_file(const std::string& path, const std::string& kind = "token");

// The credential of job `job` under a store daemon's `secret`: 64 hex characters
// (HMAC-SHA256(secret, "ddprun-job-credential-v1|" + job)). A client uses it as its
// token; it opens only the namespace named `job`.
std::string job_credential(const std::string& secret, const std::string& job);

// The job ids that ddprun (--rdzv_id) and the daemon (`credential --job`) accept: 1 to
// kMaxJobId characters, each a letter, digit, '.', '_' or '-', and neither "." nor "..".
// A job id names a daemon namespace, ddprun's runtime files and log folders, so a
// newline, a space, a '/' or a control character must not get in.
inline constexpr size_t kMaxJobId = 128;
// Nothing when `id` is a valid job id; else one line for the user:
// "invalid <flag> '<id with non-printable bytes escaped>': expected ...".
std::optional<std::string> job_id_error(const std::string& flag, const std::string& id);

// The environment variable a launcher or store daemon takes its token from when no
// token file is given.
inline constexpr const char* kTokenVariable = "DDPRUN_TOKEN";

// The token a launcher or the store daemon uses: read_token_file(token_file) when a
// file is named, else DDPRUN_TOKEN when set and non-empty, else "" (no
// authentication). Throws StoreError as read_token_file does.
std::string configured_token(const std::string& token_file);

}  // namespace rdzv
