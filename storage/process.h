// The calling process's id without a system call per query (glibc no longer caches getpid).
#pragma once

namespace tdstore::storage {

// The id of the calling process. Cached; a child created by fork() (which runs the
// pthread_atfork handlers: fork(), Python's os.fork, multiprocessing) sees its own id.
// Thread-safe.
int process_id();

// Raises the soft limit on open files to the hard limit, once per process: a read handle
// holds about five descriptors, so a dataset of thousands of shards needs more than the
// usual soft limit of 1024. Called by every store open. Thread-safe.
void raise_open_file_limit();

}  // namespace tdstore::storage
