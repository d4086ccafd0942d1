// An LD_PRELOAD library that records the file-system calls a process makes under one
// directory, with the bytes it writes, so that a test can build the states a power loss could
// leave (tests/crash_states.h). It records the calls themselves, so LMDB's writes and the C++
// library's directory operations are in the log as much as tdstore's own.
//
// TDSTORE_SYSCALL_LOG: the log file (appended); TDSTORE_SYSCALL_ROOT: the directory (an absolute,
// canonical path) whose files are recorded. Without both the library records nothing.
//
// Log records (native byte order), one per call that succeeded:
//   u32 kind, u32 fd, u64 a, u64 b, u32 path_len, u32 path2_len, u64 data_len,
//   path bytes, path2 bytes, data bytes
// kinds: see enum below. Writes through a shared mapping are not recorded (the reader table and
// LMDB's lock file are written that way; neither holds data a commit depends on).
#undef _FILE_OFFSET_BITS  // define open and open64 (pwrite, ftruncate ...) as separate symbols
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
  kOpen = 1,      // fd, path, a = 1 when the call created the file, b = 1 for O_DSYNC/O_SYNC
  kClose = 2,     // fd
  kWrite = 3,     // fd, a = offset, data
  kTruncate = 4,  // fd, a = size
  kSync = 5,      // fd (fsync or fdatasync; a file or a directory)
  kMkdir = 6,     // path
  kRename = 7,    // path -> path2 (a = 1: RENAME_EXCHANGE)
  kUnlink = 8,    // path (a = 1: a directory)
};

static int log_fd = -1;
static char root[PATH_MAX];
static size_t root_len;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define MAX_FD 4096
static char tracked[MAX_FD];  // fds open on files under root

#define REAL(name) static __typeof__(name)* real_##name
REAL(open);
REAL(open64);
REAL(openat);
REAL(openat64);
REAL(close);
REAL(write);
REAL(pwrite);
REAL(pwrite64);
REAL(writev);
REAL(ftruncate);
REAL(ftruncate64);
REAL(posix_fallocate);
REAL(posix_fallocate64);
REAL(fsync);
REAL(fdatasync);
REAL(mkdir);
REAL(rename);
REAL(renameat2);
REAL(unlinkat);
REAL(unlink);
REAL(rmdir);
REAL(remove);

__attribute__((constructor)) static void init(void) {
#define LOOKUP(name) real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name)
  LOOKUP(open), LOOKUP(open64), LOOKUP(openat), LOOKUP(openat64), LOOKUP(close), LOOKUP(write);
  LOOKUP(pwrite), LOOKUP(pwrite64), LOOKUP(writev), LOOKUP(ftruncate), LOOKUP(ftruncate64);
  LOOKUP(posix_fallocate), LOOKUP(posix_fallocate64);
  LOOKUP(fsync), LOOKUP(fdatasync), LOOKUP(mkdir), LOOKUP(rename), LOOKUP(renameat2);
  LOOKUP(unlinkat), LOOKUP(unlink), LOOKUP(rmdir), LOOKUP(remove);
  const char* log = getenv("TDSTORE_SYSCALL_LOG");
  const char* r = getenv("TDSTORE_SYSCALL_ROOT");
  if (!log || !r || strlen(r) + 1 >= sizeof root) return;
  strcpy(root, r);
  root_len = strlen(root);
  log_fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void put(const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = syscall(SYS_write, log_fd, c, n);
    if (w <= 0) abort();  // a log with a hole would build wrong states: stop loudly
    c += w, n -= (size_t)w;
  }
}

static void record(uint32_t kind, int fd, uint64_t a, uint64_t b, const char* path,
                   const char* path2, const struct iovec* iov, int iovcnt) {
  uint64_t data_len = 0;
  for (int i = 0; i < iovcnt; ++i) data_len += iov[i].iov_len;
  uint32_t head[2] = {kind, (uint32_t)fd};
  uint64_t ab[2] = {a, b};
  uint32_t lens[2] = {path ? (uint32_t)strlen(path) : 0, path2 ? (uint32_t)strlen(path2) : 0};
  put(head, sizeof head);
  put(ab, sizeof ab);
  put(lens, sizeof lens);
  put(&data_len, sizeof data_len);
  if (lens[0]) put(path, lens[0]);
  if (lens[1]) put(path2, lens[1]);
  for (int i = 0; i < iovcnt; ++i) put(iov[i].iov_base, iov[i].iov_len);
}

static int under_root(const char* abs) {
  return log_fd >= 0 && strncmp(abs, root, root_len) == 0 &&
         (abs[root_len] == '/' || abs[root_len] == 0);
}

// The absolute path of `path` relative to dirfd (not resolving symbolic links of its last part).
static int absolute(int dirfd, const char* path, char* out) {
  if (path[0] == '/') {
    if (strlen(path) >= PATH_MAX) return 0;
    strcpy(out, path);
    return 1;
  }
  char base[PATH_MAX];
  if (dirfd == AT_FDCWD) {
    if (!getcwd(base, sizeof base)) return 0;
  } else {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t n = readlink(link, base, sizeof base - 1);
    if (n <= 0) return 0;
    base[n] = 0;
  }
  return snprintf(out, PATH_MAX, "%s/%s", base, path) < PATH_MAX;
}

static int fd_tracked(int fd) { return log_fd >= 0 && fd >= 0 && fd < MAX_FD && tracked[fd]; }

static int do_open(int dirfd, const char* path, int flags, mode_t mode, int at, int large) {
  char abs[PATH_MAX];
  int watch = log_fd >= 0 && absolute(dirfd, path, abs) && under_root(abs);
  int existed = 1;
  struct stat st;
  if (watch && (flags & O_CREAT)) existed = fstatat(dirfd, path, &st, 0) == 0;
  int fd;
  if (at)
    fd = large ? real_openat64(dirfd, path, flags, mode) : real_openat(dirfd, path, flags, mode);
  else
    fd = large ? real_open64(path, flags, mode) : real_open(path, flags, mode);
  if (fd < 0 || !watch || fd >= MAX_FD) return fd;
  int saved = errno;
  pthread_mutex_lock(&mu);
  tracked[fd] = 1;
  record(kOpen, fd, existed ? 0 : 1, (flags & O_DSYNC) ? 1 : 0, abs, NULL, NULL, 0);
  if ((flags & O_TRUNC) && existed && (flags & O_ACCMODE) != O_RDONLY)
    record(kTruncate, fd, 0, 0, NULL, NULL, NULL, 0);
  pthread_mutex_unlock(&mu);
  errno = saved;
  return fd;
}

#define MODE_ARG(flags)                    \
  mode_t mode = 0;                         \
  if ((flags) & (O_CREAT | __O_TMPFILE)) { \
    va_list ap;                            \
    va_start(ap, flags);                   \
    mode = va_arg(ap, mode_t);             \
    va_end(ap);                            \
  }

int open(const char* path, int flags, ...) {
  MODE_ARG(flags);
  return do_open(AT_FDCWD, path, flags, mode, 0, 0);
}
int open64(const char* path, int flags, ...) {
  MODE_ARG(flags);
  return do_open(AT_FDCWD, path, flags, mode, 0, 1);
}
int openat(int dirfd, const char* path, int flags, ...) {
  MODE_ARG(flags);
  return do_open(dirfd, path, flags, mode, 1, 0);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  MODE_ARG(flags);
  return do_open(dirfd, path, flags, mode, 1, 1);
}

int close(int fd) {
  if (fd_tracked(fd)) {
    pthread_mutex_lock(&mu);
    tracked[fd] = 0;
    record(kClose, fd, 0, 0, NULL, NULL, NULL, 0);
    pthread_mutex_unlock(&mu);
  }
  return real_close(fd);
}

static ssize_t after_write(int fd, ssize_t n, uint64_t offset, const struct iovec* iov,
                           int iovcnt) {
  if (n <= 0 || !fd_tracked(fd)) return n;
  int saved = errno;
  // Record what the call wrote: a short write wrote the first n bytes.
  struct iovec cut[64];
  int k = 0;
  size_t left = (size_t)n;
  for (int i = 0; i < iovcnt && left > 0 && k < 64; ++i, ++k) {
    cut[k] = iov[i];
    if (cut[k].iov_len > left) cut[k].iov_len = left;
    left -= cut[k].iov_len;
  }
  pthread_mutex_lock(&mu);
  record(kWrite, fd, offset, 0, NULL, NULL, cut, k);
  pthread_mutex_unlock(&mu);
  errno = saved;
  return n;
}

static uint64_t position(int fd) {
  if (fcntl(fd, F_GETFL) & O_APPEND) {
    struct stat st;
    return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
  }
  return (uint64_t)lseek(fd, 0, SEEK_CUR);
}

ssize_t write(int fd, const void* buf, size_t n) {
  uint64_t at = fd_tracked(fd) ? position(fd) : 0;
  ssize_t w = real_write(fd, buf, n);
  struct iovec v = {(void*)buf, n};
  return after_write(fd, w, at, &v, 1);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  ssize_t w = real_pwrite(fd, buf, n, offset);
  struct iovec v = {(void*)buf, n};
  return after_write(fd, w, (uint64_t)offset, &v, 1);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t offset) {
  ssize_t w = real_pwrite64(fd, buf, n, offset);
  struct iovec v = {(void*)buf, n};
  return after_write(fd, w, (uint64_t)offset, &v, 1);
}
ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  uint64_t at = fd_tracked(fd) ? position(fd) : 0;
  ssize_t w = real_writev(fd, iov, iovcnt);
  return after_write(fd, w, at, iov, iovcnt);
}

static int after_fd_call(int rc, uint32_t kind, int fd, uint64_t a) {
  if (rc != 0 || !fd_tracked(fd)) return rc;
  pthread_mutex_lock(&mu);
  record(kind, fd, a, 0, NULL, NULL, NULL, 0);
  pthread_mutex_unlock(&mu);
  return rc;
}
int ftruncate(int fd, off_t size) {
  return after_fd_call(real_ftruncate(fd, size), kTruncate, fd, (uint64_t)size);
}
int ftruncate64(int fd, off64_t size) {
  return after_fd_call(real_ftruncate64(fd, size), kTruncate, fd, (uint64_t)size);
}
// posix_fallocate returns an error number. To the crash model an allocation that extends the
// file is a truncate to the new size (the new bytes read as zeros); one within it changes
// nothing.
static int after_allocate(int rc, int fd, uint64_t before, uint64_t end) {
  if (rc != 0 || end <= before) return rc;
  return after_fd_call(rc, kTruncate, fd, end);
}
static uint64_t file_size(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
}
int posix_fallocate(int fd, off_t offset, off_t len) {
  uint64_t before = file_size(fd);
  return after_allocate(real_posix_fallocate(fd, offset, len), fd, before,
                        (uint64_t)offset + (uint64_t)len);
}
int posix_fallocate64(int fd, off64_t offset, off64_t len) {
  uint64_t before = file_size(fd);
  return after_allocate(real_posix_fallocate64(fd, offset, len), fd, before,
                        (uint64_t)offset + (uint64_t)len);
}
int fsync(int fd) { return after_fd_call(real_fsync(fd), kSync, fd, 0); }
int fdatasync(int fd) { return after_fd_call(real_fdatasync(fd), kSync, fd, 0); }

static int after_path_call(int rc, uint32_t kind, int dirfd, const char* path, int dirfd2,
                           const char* path2, uint64_t a) {
  if (rc != 0 || log_fd < 0) return rc;
  int saved = errno;
  char abs[PATH_MAX], abs2[PATH_MAX];
  if (absolute(dirfd, path, abs) && (!path2 || absolute(dirfd2, path2, abs2)) &&
      (under_root(abs) || (path2 && under_root(abs2)))) {
    pthread_mutex_lock(&mu);
    record(kind, -1, a, 0, abs, path2 ? abs2 : NULL, NULL, 0);
    pthread_mutex_unlock(&mu);
  }
  errno = saved;
  return rc;
}
int mkdir(const char* path, mode_t mode) {
  return after_path_call(real_mkdir(path, mode), kMkdir, AT_FDCWD, path, AT_FDCWD, NULL, 0);
}
int rename(const char* from, const char* to) {
  return after_path_call(real_rename(from, to), kRename, AT_FDCWD, from, AT_FDCWD, to, 0);
}
int renameat2(int fromfd, const char* from, int tofd, const char* to, unsigned flags) {
  return after_path_call(real_renameat2(fromfd, from, tofd, to, flags), kRename, fromfd, from, tofd,
                         to, (flags & RENAME_EXCHANGE) ? 1 : 0);
}
int unlinkat(int dirfd, const char* path, int flags) {
  return after_path_call(real_unlinkat(dirfd, path, flags), kUnlink, dirfd, path, AT_FDCWD, NULL,
                         (flags & AT_REMOVEDIR) ? 1 : 0);
}
int unlink(const char* path) {
  return after_path_call(real_unlink(path), kUnlink, AT_FDCWD, path, AT_FDCWD, NULL, 0);
}
int rmdir(const char* path) {
  return after_path_call(real_rmdir(path), kUnlink, AT_FDCWD, path, AT_FDCWD, NULL, 1);
}
int remove(const char* path) {
  struct stat st;
  int is_dir = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
  return after_path_call(real_remove(path), kUnlink, AT_FDCWD, path, AT_FDCWD, NULL, is_dir);
}
