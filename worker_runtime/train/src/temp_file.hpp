// The temporary file a writer fills beside its target and renames over it (checkpoints),
// named so that a later writer can tell one left by a writer that died mid-write:
//
//   <target>.tmp.<host>.<pid namespace>.<pid>.<start time>
//
// host: this machine's name (characters other than letters, digits, '-' and '.' as
// '_'); pid namespace: the inode of /proc/self/ns/pid; start time: the writer's start
// in clock ticks since boot (/proc/<pid>/stat), which tells a reused pid from the writer.
#pragma once

#include <string>

namespace ddp::temp_file {

// The folder of `path` ("." for a bare name, "/" for one in the root).
std::string directory_of(const std::string& path);

// This process's temporary file name for `target`.
std::string name_for(const std::string& target);

// Removes the temporary files of `target` whose writer is gone: written on this host
// in this pid namespace, by a pid that no longer runs (or is a zombie) or that now
// belongs to a process started at another time. A file of another host or pid
// namespace, of a live writer, or named otherwise stays. Never throws: a file that
// cannot be removed stays too.
void remove_stale(const std::string& target);

}  // namespace ddp::temp_file
