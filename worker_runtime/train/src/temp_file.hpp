// The temporary file a writer fills beside its target and renames over it (checkpoints),
// named so that a later writer can tell one left by a writer that died mid-write:
//
//   <target>.tmp.<machine id>.<pid>.<start time>
//
// machine id: 8 hex digits hashing this host's name and the inode of its pid namespace
// (/proc/self/ns/pid), so the name grows by at most 5 + 8 + 1 + 10 + 1 + 20 bytes
// whatever the host is called; start time: the writer's start in clock ticks since boot
// (/proc/<pid>/stat), which tells a reused pid from the writer. Two machines with the
// same host name, both in the initial pid namespace, get the same machine id (as do,
// once in 4 billion, two different ones): sharing a folder (NFS), one may remove a
// temporary file of the other's live writer whose pid is not running on it.
#pragma once

#include <string>

namespace ddp::temp_file {

// The folder of `path` ("." for a bare name, "/" for one in the root).
std::string directory_of(const std::string& path);

// This process's temporary file name for `target`.
std::string name_for(const std::string& target);

// Removes the temporary files of `target` whose writer is gone: written under this
// machine id, by a pid that no longer runs (or is a zombie) or that now belongs to a
// process started at another time. A file of another machine id, of a live writer, or
// named otherwise (the older "<target>.tmp.<pid>" included) stays. Never throws: a file that
// cannot be removed stays too.
void remove_stale(const std::string& target);

}  // namespace ddp::temp_file
