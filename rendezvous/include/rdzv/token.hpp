// The shared secret that store clients prove they know (see src/auth.hpp for the
// challenge-response): generating one and reading one from a file.
#pragma once

#include <string>

namespace rdzv {

// 32 random bytes as 64 hex characters.
std::string generate_token();

// A token file's first line without surrounding whitespace. Throws StoreError
// naming the file when it cannot be read or is empty.
std::string read_token_file(const std::string& path);

// The environment variable a launcher or store daemon takes its token from when no
// token file is given.
inline constexpr const char* kTokenVariable = "DDPRUN_TOKEN";

// The token a launcher or the store daemon uses: read_token_file(token_file) when a
// file is named, else DDPRUN_TOKEN when set and non-empty, else "" (no
// authentication). Throws StoreError as read_token_file does.
std::string configured_token(const std::string& token_file);

}  // namespace rdzv
