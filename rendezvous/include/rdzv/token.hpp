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

}  // namespace rdzv
