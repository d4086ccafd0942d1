// The calling process's id without a system call per query (glibc no longer caches getpid).
#pragma once

namespace tdstore::storage {

// The id of the calling process. Cached; a child created by fork() (which runs the
// pthread_atfork handlers: fork(), Python's os.fork, multiprocessing) sees its own id.
// Thread-safe.
int process_id();

}  // namespace tdstore::storage
