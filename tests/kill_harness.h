// The one harness of every kill test. A child process (a test of this binary started fresh, a
// forked function, or another program) reports its progress as lines on a pipe; the parent
// waits for the progress a round needs and kills the child at a point measured in that
// progress ("after the k-th begun commit"), never in wall-clock time from the fork. No
// assertion depends on how fast the machine is:
//
// - a child reports `begin N` before an operation and `done N` after it (report()); a kill
//   after which the last `begin` has no `done` landed mid-operation (Killed::mid_operation);
// - a kill test runs rounds until enough kills landed mid-operation (KillRounds), and fails
//   loudly when the child stops reporting for kProgressTimeout or the rounds run out, instead of
//   counting a kill that tested nothing.
//
// The parent reads the child's `begin` and then sends SIGKILL; between the two it may be
// descheduled for any time, and the child runs on. So a kill sent "after the k-th begin" lands
// anywhere from inside that operation to after the child's exit, and a test asserts only what
// the kill that landed implies, read from Killed (all events the child wrote before it died
// are read before kill() returns):
//
// - mid_operation: the child died between its last `begin` and that operation's `done`, so
//   the operation's effect is absent or, if it completed before the kill, exactly that
//   operation's (a commit finished but not yet reported);
// - signaled, not mid_operation: the child died after its last `done` (last_done says how far
//   it got) and before its next `begin`, or after it reported its last operation;
// - not signaled: the child exited by itself before the kill (code is its exit code).
//
// The only clock is that cap: a child silent for minutes is hung, not slow.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/child_process.h"

namespace tdstore::testing {

// How long a child may go without reporting before the parent calls it hung. Generous: a
// machine under load is slow, never minutes slow. TDSTORE_PROGRESS_TIMEOUT_S overrides it.
inline std::chrono::milliseconds progress_timeout() {
  const char* s = std::getenv("TDSTORE_PROGRESS_TIMEOUT_S");
  return std::chrono::seconds(s ? std::atoi(s) : 300);
}

// ---- the child's side

// The descriptor a child reports on: set by Child::fork, or inherited through
// TDSTORE_PROGRESS_FD by a test started with Child::test.
inline int& progress_fd() {
  static int fd = [] {
    const char* s = std::getenv("TDSTORE_PROGRESS_FD");
    return s ? std::atoi(s) : -1;
  }();
  return fd;
}

// Reports one event ("ready", "begin", "done", or a name of the test's own) with a value. One
// write() of less than PIPE_BUF bytes, so lines never interleave. A child whose parent is gone
// exits at once.
inline void report(std::string_view event, int64_t value = 0) {
  if (progress_fd() < 0) return;
  std::string line = std::string(event) + " " + std::to_string(value) + "\n";
  if (::write(progress_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    _exit(3);
}

// ---- the parent's side

struct Event {
  std::string name;
  int64_t value = 0;
};

// What a kill left: the events read after it, and how the child ended.
struct Killed {
  bool signaled = false;       // the SIGKILL ended the child (it had not exited by itself)
  int code = 0;                // wait()'s code: 128 + SIGKILL when signaled
  bool mid_operation = false;  // killed after a `begin` whose `done` never came
  std::optional<int64_t> last_begin, last_done;  // over the child's whole life

  // Where the kill landed, for failure messages.
  std::string landed() const {
    auto value = [](const std::optional<int64_t>& v) {
      return v ? std::to_string(*v) : std::string("none");
    };
    if (!signaled) return "the child exited by itself with code " + std::to_string(code);
    if (mid_operation)
      return "killed mid-operation (begin " + value(last_begin) + ", last done " +
             value(last_done) + ")";
    return "killed between operations (last done " + value(last_done) + ")";
  }
};

class Child {
 public:
  // A test of this binary in a fresh process (fork + exec of /proc/self/exe), with
  // TDSTORE_CHILD_ARG=arg and `env` set; it reports through report().
  static Child test(const std::string& test, const std::string& arg,
                    const std::vector<std::pair<std::string, std::string>>& env = {}) {
    Child c;
    int fds[2];
    c.open_pipe(fds);
    c.pid_ = ::fork();
    if (c.pid_ == 0) {
      ::fcntl(fds[1], F_SETFD, 0);  // this child's report end survives its exec; no other's does
      setenv("TDSTORE_PROGRESS_FD", std::to_string(fds[1]).c_str(), 1);
      setenv("TDSTORE_CHILD_ARG", arg.c_str(), 1);
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      unsetenv("GTEST_OUTPUT");
      unsetenv("GTEST_TOTAL_SHARDS");  // the child's one test is in no shard of the parent's
      unsetenv("GTEST_SHARD_INDEX");
      unsetenv("GTEST_SHARD_STATUS_FILE");
      const std::string filter = "--gtest_filter=" + test;
      execl("/proc/self/exe", "child", filter.c_str(), "--gtest_brief=1", (char*)nullptr);
      _exit(127);
    }
    c.started(fds, test);
    return c;
  }

  // A forked copy of this process running fn; it exits with kChildPassed when fn returns and
  // with 21 when fn throws. For the torch-free storage tests, whose children need no exec.
  static Child fork(const std::function<void()>& fn, const std::string& what = "forked child") {
    Child c;
    int fds[2];
    c.open_pipe(fds);
    c.pid_ = ::fork();
    if (c.pid_ == 0) {
      ::close(fds[0]);
      progress_fd() = fds[1];
      try {
        fn();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", what.c_str(), e.what());
        _exit(21);
      } catch (...) {
        _exit(21);
      }
      _exit(kChildPassed);
    }
    c.started(fds, what);
    return c;
  }

  // Another program (argv[0] looked up in PATH). Its stderr lines are its progress, each
  // turned into an Event by `parse` (nullopt: not progress); its stdout goes to /dev/null. Its
  // codes (wait(), Killed::code) are its own exit status (0: success), or 128 + signal.
  static Child program(const std::vector<std::string>& argv,
                       std::function<std::optional<Event>(std::string_view line)> parse) {
    Child c;
    c.parse_ = std::move(parse);
    c.program_ = true;
    int fds[2];
    c.open_pipe(fds);
    c.pid_ = ::fork();
    if (c.pid_ == 0) {
      int devnull = ::open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(fds[1], 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    c.started(fds, argv.empty() ? "program" : argv[0]);
    return c;
  }

  Child(Child&& o) noexcept { *this = std::move(o); }
  Child& operator=(Child&& o) noexcept {
    std::swap(pid_, o.pid_), std::swap(code_, o.code_), std::swap(fd_, o.fd_),
        std::swap(buffer_, o.buffer_);
    std::swap(parse_, o.parse_), std::swap(what_, o.what_), std::swap(log_, o.log_);
    std::swap(program_, o.program_);
    std::swap(open_begin_, o.open_begin_), std::swap(last_begin_, o.last_begin_),
        std::swap(last_done_, o.last_done_);
    std::swap(events_, o.events_);
    return *this;
  }
  ~Child() {
    if (pid_ > 0) {  // a test that failed before ending its child
      ::kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  pid_t pid() const { return pid_; }

  // The next event. nullopt when the child closed its end (it exited); a test failure and
  // nullopt when it reported nothing for progress_timeout().
  std::optional<Event> next() {
    for (;;) {
      if (auto e = take_line()) return e;
      if (fd_ < 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(progress_timeout().count()));
      if (r == 0) {
        ADD_FAILURE() << what_ << " (pid " << pid_ << ") reported nothing for "
                      << progress_timeout().count() / 1000 << " s; last events:" << log_;
        return std::nullopt;
      }
      if (r < 0 && errno == EINTR) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd_);
        fd_ = -1;
        continue;  // a last line without a newline is still taken
      }
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

  // Reads the events already reported, without waiting (last_begin() and last_done() then
  // include them).
  void take_reported() {
    while (fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd_);
        fd_ = -1;
        break;
      }
      buffer_.append(buf, static_cast<size_t>(n));
    }
    while (take_line()) {
    }
  }

  // Reads events until the `count`-th event named `name` since this call (returned). nullopt,
  // with a test failure naming the wait, when the child ends or goes silent first.
  std::optional<Event> wait_for(std::string_view name, int count = 1) {
    for (int seen = 0;;) {
      auto e = next();
      if (!e) {
        ADD_FAILURE() << what_ << " (pid " << pid_ << ") ended before reporting '" << name << "' "
                      << (count - seen) << " more time(s); last events:" << log_;
        return std::nullopt;
      }
      if (e->name == name && ++seen == count) return e;
    }
  }

  // SIGKILL now, reap, and read what the child reported before it died. Where the kill landed
  // is the Killed's to tell: the child ran on while the parent got here.
  Killed kill() {
    Killed k;
    if (pid_ > 0) ::kill(pid_, SIGKILL);  // not a child already reaped (kill(-1) is everyone)
    k.code = reap();
    k.signaled = k.code == 128 + SIGKILL;
    while (next()) {
    }
    k.mid_operation = k.signaled && open_begin_;
    k.last_begin = last_begin_, k.last_done = last_done_;
    return k;
  }

  // Waits for the child to exit by itself, reading its events; its code (wait_child()'s for a
  // test child, the exit status for a program; the same code again for a child already reaped, as
  // after kill()). Returns when the child exits even if a process it forked still holds its report
  // end. A child that neither exits nor reports for progress_timeout() fails the test and is
  // killed.
  int wait() {
    auto silent_since = std::chrono::steady_clock::now();
    while (pid_ > 0) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        code_ = code_of(status), pid_ = -1;
        break;
      }
      const uint64_t before = events_;
      if (fd_ >= 0) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 10) > 0) take_reported();  // 10 ms: how often the exit is looked for
      } else {
        ::poll(nullptr, 0, 10);
      }
      if (events_ != before) silent_since = std::chrono::steady_clock::now();
      if (std::chrono::steady_clock::now() - silent_since > progress_timeout()) {
        ADD_FAILURE() << what_ << " (pid " << pid_ << ") neither exited nor reported for "
                      << progress_timeout().count() / 1000 << " s; last events:" << log_;
        ::kill(pid_, SIGKILL);
        return reap();
      }
    }
    take_reported();
    return code_;
  }

  std::optional<int64_t> last_done() const { return last_done_; }
  std::optional<int64_t> last_begin() const { return last_begin_; }

 private:
  Child() = default;
  void open_pipe(int fds[2]) {
    // Close-on-exec, so that a sibling started later never holds this child's report end.
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      std::abort();
    }
  }
  void started(int fds[2], std::string what) {
    ::close(fds[1]);
    fd_ = fds[0];
    what_ = std::move(what);
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      std::abort();
    }
  }
  int reap() {  // once; later calls return the same code
    if (pid_ > 0) {
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      code_ = code_of(status), pid_ = -1;
    }
    return code_;
  }
  // A test child's code is child_code()'s (0: its test passed); a program's is its own.
  int code_of(int status) const {
    if (!program_) return child_code(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::optional<Event> take_line() {
    for (;;) {
      size_t nl = buffer_.find('\n');
      if (nl == std::string::npos) {
        if (fd_ >= 0 || buffer_.empty()) return std::nullopt;
        nl = buffer_.size();
      }
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, std::min(nl + 1, buffer_.size()));
      std::optional<Event> e = parse_ ? parse_(line) : parse_report(line);
      if (!e) continue;
      ++events_;
      log_ += " [" + e->name + " " + std::to_string(e->value) + "]";
      if (log_.size() > 400) log_.erase(0, log_.size() - 400);
      if (e->name == "begin") open_begin_ = true, last_begin_ = e->value;
      if (e->name == "done") open_begin_ = false, last_done_ = e->value;
      return e;
    }
  }
  static std::optional<Event> parse_report(std::string_view line) {
    const size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos) return std::nullopt;
    return Event{std::string(line.substr(0, sp)),
                 std::strtoll(std::string(line.substr(sp + 1)).c_str(), nullptr, 10)};
  }

  pid_t pid_ = -1;
  int code_ = -1;  // code_of() the child's status once reaped
  int fd_ = -1;
  std::string buffer_;
  std::function<std::optional<Event>(std::string_view)> parse_;
  std::string what_, log_;
  bool program_ = false;  // started by program(): codes are its own exit status
  uint64_t events_ = 0;   // events read so far
  bool open_begin_ = false;
  std::optional<int64_t> last_begin_, last_done_;
};

// The loop of a kill test: rounds go on until `wanted` kills landed mid-operation; more than
// `max_rounds` rounds fail the test (the kills kept missing the operations: the child's
// progress reports are in the wrong place, not the machine too slow).
class KillRounds {
 public:
  KillRounds(int wanted, int max_rounds) : wanted_(wanted), max_rounds_(max_rounds) {}
  // Whether to run another round: until `wanted` kills landed mid-operation and `unmet` (a
  // test's own condition on what its rounds must have seen, named in the failure) is empty.
  bool more(std::string_view unmet = {}) {
    if (mid_ >= wanted_ && unmet.empty()) return false;
    if (rounds_ >= max_rounds_) {
      ADD_FAILURE() << "after " << rounds_ << " rounds only " << mid_ << " of " << wanted_
                    << " kills landed mid-operation" << (unmet.empty() ? "" : "; still unmet: ")
                    << unmet;
      return false;
    }
    ++rounds_;
    return true;
  }
  void count(const Killed& k) {
    mid_ += k.mid_operation;
    between_ += k.signaled && !k.mid_operation;
    exited_ += !k.signaled;
  }
  int rounds() const { return rounds_; }
  int mid_operation() const { return mid_; }
  bool done() const { return mid_ >= wanted_; }
  // Where the counted kills landed, for the test's log.
  std::string landings() const {
    return std::to_string(mid_) + " kills landed mid-operation, " + std::to_string(between_) +
           " between operations, " + std::to_string(exited_) + " after the child exited, in " +
           std::to_string(rounds_) + " rounds";
  }

 private:
  int wanted_, max_rounds_, rounds_ = 0, mid_ = 0, between_ = 0, exited_ = 0;
};

}  // namespace tdstore::testing
