// A process's scheduler state, as /proc/<pid>/stat gives it.
#pragma once

#include <sys/types.h>

namespace ddprun {

// The state letter of /proc/<pid>/stat ('R', 'S', 'D', 'T' stopped by a signal,
// 't' stopped by a tracer, 'Z', ...), or 0 when the process is gone.
char process_state_letter(pid_t pid);

// Stopped (SIGSTOP, SIGTSTP, or a tracer): it runs no handler and ends on no signal
// but SIGKILL until it is continued.
inline bool is_stopped_state(char letter) { return letter == 'T' || letter == 't'; }

}  // namespace ddprun
