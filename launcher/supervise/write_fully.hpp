// Writing a whole buffer to a file descriptor (the console, log files, the orphan
// guard's pipe).
#pragma once

#include <cstddef>
#include <string_view>

namespace ddprun {

// Writes `data` to `fd`, retrying short writes, EINTR and EAGAIN. Returns how many
// bytes were written: all of them, or fewer after an error (e.g. EPIPE when the
// reader went away, ENOSPC), which errno then holds.
size_t write_fully(int fd, std::string_view data);

}  // namespace ddprun
