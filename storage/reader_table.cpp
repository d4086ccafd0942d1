#include "storage/reader_table.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "storage/messages.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

constexpr char kReaderTableMagic[8] = {'T', 'D', 'S', 'T', 'R', 'D', 'R', '\0'};
constexpr uint32_t kVersion = 2;
constexpr uint64_t kClearing = UINT64_MAX;  // a slot being freed by clear_dead()

struct TableHeader {
  char magic[8];
  uint32_t version;
  uint32_t slots;
  uint64_t bound;  // no slot at or past it was claimed since the table was built: scans stop there
  uint64_t reserved[5];
};
static_assert(sizeof(TableHeader) == 64);

constexpr size_t kFileSize = sizeof(TableHeader) + ReaderTable::kSlots * sizeof(ReaderTable::Slot);

std::atomic_ref<uint64_t> field(uint64_t& v) { return std::atomic_ref<uint64_t>(v); }

// Field 22 of /proc/<pid>/stat (start time in clock ticks after boot): nullopt when the process
// does not exist, 0 when the file cannot be read or parsed. Plain system calls, no allocation:
// it also runs in a pthread_atfork child handler.
std::optional<uint64_t> start_time_of(pid_t pid) {
  char path[64], buf[1024];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? std::nullopt : std::optional<uint64_t>(0);
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* s = std::strrchr(buf, ')');
  if (!s) return 0;
  ++s;
  for (int fieldno = 3; fieldno < 22 && *s; ++fieldno) {  // fields after the command: state is 3
    while (*s == ' ') ++s;
    while (*s && *s != ' ') ++s;
  }
  return std::strtoull(s, nullptr, 10);
}

bool proc_readable() {
  static const bool readable = ::access("/proc/self/stat", R_OK) == 0;
  return readable;
}

uint64_t owner_of(pid_t pid, uint64_t start_time) {
  return static_cast<uint32_t>(pid) | (start_time & 0xffffffffu) << 32;
}

// This process's owner word, computed once per pid (a forked child has its own).
uint64_t my_owner() {
  static std::atomic<uint64_t> cached_pid{0}, cached{0};
  const pid_t pid = ::getpid();
  if (cached_pid.load() != static_cast<uint64_t>(pid)) {
    cached.store(owner_of(pid, start_time_of(pid).value_or(0)));
    cached_pid.store(static_cast<uint64_t>(pid));
  }
  return cached.load();
}

// Whether the process an owner word names still exists (a reused pid has another start time).
bool alive(uint64_t owner) {
  const pid_t pid = static_cast<pid_t>(owner & 0xffffffffu);
  if (pid == ::getpid()) return owner == my_owner();
  if (!proc_readable()) return !(::kill(pid, 0) != 0 && errno == ESRCH);
  const auto t = start_time_of(pid);
  if (!t) return false;
  return *t == 0 || (*t & 0xffffffffu) == owner >> 32;  // unreadable: assume alive
}

// The tables open in this process, by the identity of their file.
struct Registry {
  std::mutex mu;
  std::map<std::pair<dev_t, ino_t>, std::weak_ptr<ReaderTable>> open;
};
Registry& registry() {
  static Registry* r = new Registry;  // leaked: tables may outlive static destruction
  return *r;
}

}  // namespace

// A forked child inherits its parent's views of every store: before fork() returns in the
// child, each of this process's registrations claims a slot of its own at the oldest generation
// its pins read. The locks are taken before the fork so that the child finds them consistent.
struct ForkHandlers {
  static inline std::vector<std::shared_ptr<ReaderTable>> tables;
  static inline std::vector<std::shared_ptr<ReaderPins>> pins;

  // The locks are held from prepare() to parent() or child(): across functions, which the
  // analysis does not follow.
  static void prepare() NO_THREAD_SAFETY_ANALYSIS {
    registry().mu.lock();
    for (auto& [id, weak] : registry().open) {
      auto t = weak.lock();
      if (!t) continue;
      t->mu_.lock();
      tables.push_back(t);
      auto p = t->pins_.lock();
      if (p) p->mu_.lock();
      pins.push_back(std::move(p));
    }
  }
  static void unlock_all() NO_THREAD_SAFETY_ANALYSIS {
    for (size_t i = tables.size(); i-- > 0;) {
      if (pins[i]) pins[i]->mu_.unlock();
      tables[i]->mu_.unlock();
    }
    registry().mu.unlock();
  }
  static void parent() {
    unlock_all();
    release_refs();
  }
  static void child() NO_THREAD_SAFETY_ANALYSIS {
    for (auto& p : pins) {
      if (!p || !p->slot_) continue;
      const uint64_t g =
          p->counts_.empty() ? field(p->slot_->generation).load() : p->counts_.begin()->first;
      try {
        p->slot_ = p->table_->claim(g);
      } catch (const Error&) {
        p->slot_ = nullptr;  // the table is full: the child reads unprotected (documented)
      }
    }
    unlock_all();
    release_refs();
  }
  static void release_refs() {
    // Dropped outside the locks: a last reference destroys its table or registration.
    auto t = std::move(tables);
    auto p = std::move(pins);
    tables.clear(), pins.clear();
  }
};

std::shared_ptr<ReaderTable> ReaderTable::open(const std::filesystem::path& dir, bool reader) {
  static const bool handlers = [] {
    return pthread_atfork(ForkHandlers::prepare, ForkHandlers::parent, ForkHandlers::child) == 0;
  }();
  (void)handlers;
  const std::filesystem::path path = dir / kReaderTableFile;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 && reader && (errno == EACCES || errno == EROFS)) return nullptr;
  if (fd < 0)
    throw_os_error(path, "cannot open the reader table", errno,
                   " (readers register here so that writers do not reuse what they read; on a "
                   "read-only file system open with StoreOptions::shared_readonly)");
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    throw_os_error(path, what, err);
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("fstat of the reader table failed");
  auto& reg = registry();
  std::lock_guard lock(reg.mu);
  if (auto it = reg.open.find({st.st_dev, st.st_ino}); it != reg.open.end()) {
    if (auto t = it->second.lock()) {
      ::close(fd);
      return t;
    }
  }
  // Nobody else has the file open: whatever it holds is left by processes that are gone
  // (killed, or before a restart). Rebuild it empty, then share it.
  int rc;
  while ((rc = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  const bool alone = rc == 0;
  if (alone) {
    TableHeader h{};
    std::memcpy(h.magic, kReaderTableMagic, 8);
    h.version = kVersion;
    h.slots = kSlots;
    // Reserved, not sparse: it is written through a mapping (a hole touched on a full file
    // system would be a SIGBUS). Its 256 KiB are cheap.
    if (::ftruncate(fd, 0) != 0) fail("cannot size the reader table");
    if (int rc = ::posix_fallocate(fd, 0, kFileSize); rc != 0) {
      errno = rc;
      fail("cannot size the reader table");
    }
    if (::pwrite(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
      fail("cannot write the reader table");
  }
  if (alone || errno == EWOULDBLOCK) {  // file systems without flock: neither lock nor rebuild
    while (::flock(fd, LOCK_SH) != 0) {
      if (errno != EINTR) fail("flock of the reader table failed");
    }
  }
  if (::fstat(fd, &st) != 0) fail("fstat of the reader table failed");
  std::shared_ptr<ReaderTable> t(new ReaderTable);
  t->path_ = path;
  t->fd_ = fd;
  if (static_cast<size_t>(st.st_size) < kFileSize) {
    TableHeader h{};
    [[maybe_unused]] ssize_t n = ::pread(fd, &h, sizeof h, 0);
    throw CorruptionError(
        path.string() + ": a reader table of version " + std::to_string(h.version) + " with " +
        std::to_string(h.slots) +
        " slots, in use by a process of another tdstore build (this one uses version " +
        std::to_string(kVersion) + "); it is rebuilt when no process has the store open");
  }
  void* p = ::mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw_io_error(path, "mmap of the reader table");
  t->map_ = static_cast<uint8_t*>(p);
  t->size_ = kFileSize;
  const auto* h = reinterpret_cast<const TableHeader*>(t->map_);
  if (std::memcmp(h->magic, kReaderTableMagic, 8) != 0 || h->version != kVersion ||
      h->slots != kSlots)
    throw CorruptionError(
        path.string() + ": not a reader table of version " + std::to_string(kVersion) + " with " +
        std::to_string(kSlots) +
        " slots (it holds no data: it is rebuilt when no process has the store open)");
  std::erase_if(reg.open, [](const auto& entry) { return entry.second.expired(); });
  reg.open[{st.st_dev, st.st_ino}] = t;
  return t;
}

ReaderTable::~ReaderTable() {
  if (map_) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);  // drops the shared flock
}

ReaderTable::Slot* ReaderTable::slots() const {
  return reinterpret_cast<Slot*>(map_ + sizeof(TableHeader));
}

uint32_t ReaderTable::bound() const {
  auto* h = reinterpret_cast<TableHeader*>(map_);
  return static_cast<uint32_t>(std::min<uint64_t>(field(h->bound).load(), kSlots));
}

std::shared_ptr<ReaderPins> ReaderTable::pins() {
  MutexLock lock(&mu_);
  if (auto p = pins_.lock()) return p;
  auto p = std::make_shared<ReaderPins>(shared_from_this(), claim(0));
  pins_ = p;
  return p;
}

void ReaderTable::clear_dead() {
  Slot* s = slots();
  for (uint32_t i = 0, end = bound(); i < end; ++i) {
    uint64_t owner = field(s[i].owner).load();
    if (owner == 0 || owner == kClearing || alive(owner)) continue;
    // The process is gone: free its slot, unless another scan got there first. The sentinel
    // keeps claimants off the slot while its generation is reset.
    if (!field(s[i].owner).compare_exchange_strong(owner, kClearing)) continue;
    field(s[i].generation).store(0);
    field(s[i].owner).store(0);
  }
}

ReaderTable::Slot* ReaderTable::claim(uint64_t generation) {
  const uint64_t me = my_owner();
  for (int round = 0; round < 2; ++round) {
    Slot* s = slots();
    for (uint32_t i = 0; i < kSlots; ++i) {
      uint64_t expect = 0;
      if (field(s[i].owner).load() != 0 || !field(s[i].owner).compare_exchange_strong(expect, me))
        continue;
      // A free slot's generation is 0 ("any"): the slot protects everything from the claim on.
      field(s[i].generation).store(generation);
      // Raised before the claimant reads a header: a scan that missed the slot decided for
      // generations the claimant never reads (FORMAT.md, "Reader table").
      auto bound = field(reinterpret_cast<TableHeader*>(map_)->bound);
      for (uint64_t b = bound.load(); b < i + 1 && !bound.compare_exchange_weak(b, i + 1);) {
      }
      return &s[i];
    }
    clear_dead();
  }
  throw CapacityError(path_.string() + ": the reader table is full: " + std::to_string(kSlots) +
                      " live processes have the store open; close some");
}

void ReaderTable::release(Slot* slot) {
  field(slot->generation).store(0);
  field(slot->owner).store(0);
}

uint64_t ReaderTable::oldest(uint64_t current) {
  clear_dead();
  uint64_t low = current;
  Slot* s = slots();
  for (uint32_t i = 0, end = bound(); i < end; ++i) {
    const uint64_t owner = field(s[i].owner).load();
    if (owner == 0 || owner == kClearing) continue;
    low = std::min(low, field(s[i].generation).load());
  }
  return low;
}

uint32_t ReaderTable::readers() {
  clear_dead();
  uint32_t n = 0;
  const uint64_t me = my_owner();
  for (uint32_t i = 0, end = bound(); i < end; ++i) {
    const uint64_t owner = field(slots()[i].owner).load();
    n += owner != 0 && owner != me && owner != kClearing;
  }
  return n;
}

// ------------------------------------------------------------------------------------------

struct ReaderPins::Pin {
  std::shared_ptr<ReaderPins> owner;
  uint64_t generation;
  std::shared_ptr<const void> keep;
  ~Pin() { owner->remove(generation); }
};

ReaderPins::ReaderPins(std::shared_ptr<ReaderTable> table, ReaderTable::Slot* slot)
    : table_(std::move(table)), slot_(slot) {}

ReaderPins::~ReaderPins() {
  if (slot_) table_->release(slot_);
}

std::shared_ptr<const void> ReaderPins::pin(uint64_t generation, std::shared_ptr<const void> keep) {
  add(generation);
  auto p = std::make_shared<Pin>();
  p->owner = shared_from_this();
  p->generation = generation;
  p->keep = std::move(keep);
  return p;
}

uint64_t ReaderPins::oldest() const {
  MutexLock lock(&mu_);
  return counts_.empty() ? UINT64_MAX : counts_.begin()->first;
}

void ReaderPins::add(uint64_t generation) {
  MutexLock lock(&mu_);
  ++counts_[generation];
  publish();
}

void ReaderPins::remove(uint64_t generation) {
  MutexLock lock(&mu_);
  if (auto it = counts_.find(generation); it != counts_.end() && --it->second == 0)
    counts_.erase(it);
  publish();
}

void ReaderPins::publish() {
  if (!slot_) return;
  // Nothing pinned (between two pins of one handle): keep the last value, never raise it
  // past what a view may still read. A handle always holds a pin of its own generation.
  if (!counts_.empty()) field(slot_->generation).store(counts_.begin()->first);
}

}  // namespace tdstore::storage
