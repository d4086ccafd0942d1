#include "storage/reader_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'S', 'T', 'R', 'D', 'R', '\0'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kClearing = UINT64_MAX;  // a slot being freed by clear_dead()

struct TableHeader {
  char magic[8];
  uint32_t version;
  uint32_t slots;
  uint64_t reserved[6];
};
static_assert(sizeof(TableHeader) == 64);

constexpr size_t kFileSize = sizeof(TableHeader) + ReaderTable::kSlots * sizeof(ReaderTable::Slot);

std::atomic_ref<uint64_t> field(uint64_t& v) { return std::atomic_ref<uint64_t>(v); }

// Field 22 of /proc/<pid>/stat (start time in clock ticks after boot); 0 when unknown.
uint64_t start_time_of(const std::string& proc) {
  std::ifstream f(proc);
  std::string line;
  if (!std::getline(f, line)) return 0;
  size_t p = line.rfind(')');
  if (p == std::string::npos) return 0;
  // Fields after the command: state is field 3; starttime is field 22.
  const char* s = line.c_str() + p + 1;
  for (int fieldno = 3; fieldno < 22 && *s; ++fieldno) {
    while (*s == ' ') ++s;
    while (*s && *s != ' ') ++s;
  }
  return std::strtoull(s, nullptr, 10);
}

// Cached per pid: a forked child has its own start time.
uint64_t my_start_time() {
  static std::atomic<uint64_t> cached_pid{0}, cached{0};
  const uint64_t pid = static_cast<uint64_t>(::getpid());
  if (cached_pid.load() != pid) {
    cached.store(start_time_of("/proc/self/stat"));
    cached_pid.store(pid);
  }
  return cached.load();
}

}  // namespace

std::shared_ptr<ReaderTable> ReaderTable::open(const std::filesystem::path& dir, bool reader) {
  std::shared_ptr<ReaderTable> t(new ReaderTable);
  t->path_ = dir / kReaderTableFile;
  int fd = ::open(t->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 && reader && (errno == EACCES || errno == EROFS)) return nullptr;
  if (fd < 0)
    throw IOError(t->path_.string() + ": cannot open the reader table: " + std::strerror(errno) +
                  " (readers register here so that writers do not reuse what they read; on a "
                  "read-only file system open with StoreOptions::shared_readonly)");
  struct stat st;
  if (::fstat(fd, &st) != 0 ||
      (static_cast<size_t>(st.st_size) < kFileSize && ::ftruncate(fd, kFileSize) != 0)) {
    int err = errno;
    ::close(fd);
    throw IOError(t->path_.string() + ": cannot size the reader table: " + std::strerror(err));
  }
  void* p = ::mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    throw IOError(t->path_.string() + ": mmap of the reader table failed: " + std::strerror(err));
  t->map_ = static_cast<uint8_t*>(p);
  t->size_ = kFileSize;
  auto* h = reinterpret_cast<TableHeader*>(t->map_);
  static const TableHeader zero{};
  if (std::memcmp(h, &zero, sizeof zero) == 0) {  // new: every creator writes the same bytes
    TableHeader init{};
    std::memcpy(init.magic, kMagic, 8);
    init.version = kVersion;
    init.slots = kSlots;
    std::memcpy(h, &init, sizeof init);
  } else if (std::memcmp(h->magic, kMagic, 8) != 0 || h->version != kVersion ||
             h->slots != kSlots) {
    throw CorruptionError(
        t->path_.string() + ": not a reader table of version " + std::to_string(kVersion) +
        " with " + std::to_string(kSlots) +
        " slots (it holds no data: remove it while no process has the store open)");
  }
  return t;
}

ReaderTable::~ReaderTable() {
  if (map_) ::munmap(map_, size_);
}

ReaderTable::Slot* ReaderTable::slots() const {
  return reinterpret_cast<Slot*>(map_ + sizeof(TableHeader));
}

bool ReaderTable::alive(uint64_t pid, uint64_t start_time) const {
  if (pid == static_cast<uint64_t>(::getpid())) return start_time == my_start_time();
  std::string proc = "/proc/" + std::to_string(pid) + "/stat";
  if (::access("/proc/self/stat", R_OK) == 0) {
    if (::access(proc.c_str(), F_OK) != 0) return false;
    uint64_t t = start_time_of(proc);
    return t == 0 || start_time == 0 || t == start_time;  // unreadable: assume alive
  }
  return !(::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
}

void ReaderTable::clear_dead() {
  Slot* s = slots();
  for (uint32_t i = 0; i < kSlots; ++i) {
    uint64_t pid = field(s[i].pid).load();
    if (pid == 0) continue;
    uint64_t start = field(s[i].start_time).load();
    if (pid == kClearing || start == 0 || alive(pid, start)) continue;  // start 0: being claimed
    // The process is gone: free its slot, unless another scan got there first. The sentinel
    // keeps claimants off the slot while its fields are reset.
    uint64_t expect = pid;
    if (!field(s[i].pid).compare_exchange_strong(expect, kClearing)) continue;
    field(s[i].generation).store(0);
    field(s[i].start_time).store(0);
    field(s[i].pid).store(0);
  }
}

ReaderTable::Slot* ReaderTable::claim() {
  const uint64_t me = static_cast<uint64_t>(::getpid());
  for (int round = 0; round < 2; ++round) {
    Slot* s = slots();
    for (uint32_t i = 0; i < kSlots; ++i) {
      uint64_t expect = 0;
      if (field(s[i].pid).load() != 0 || !field(s[i].pid).compare_exchange_strong(expect, me))
        continue;
      field(s[i].generation).store(0);
      field(s[i].start_time).store(my_start_time() ? my_start_time() : 1);
      return &s[i];
    }
    clear_dead();
  }
  throw Error(path_.string() + ": the reader table is full: " + std::to_string(kSlots) +
              " handles of live processes have the store open; close some");
}

void ReaderTable::set_generation(Slot* slot, uint64_t generation) {
  field(slot->generation).store(generation);
}

void ReaderTable::release(Slot* slot) {
  field(slot->generation).store(0);
  field(slot->start_time).store(0);
  field(slot->pid).store(0);
}

uint64_t ReaderTable::oldest(uint64_t current) {
  clear_dead();
  uint64_t low = current;
  Slot* s = slots();
  for (uint32_t i = 0; i < kSlots; ++i) {
    if (field(s[i].pid).load() == 0) continue;
    low = std::min(low, field(s[i].generation).load());
  }
  return low;
}

uint32_t ReaderTable::readers() {
  clear_dead();
  uint32_t n = 0;
  const uint64_t me = static_cast<uint64_t>(::getpid());
  for (uint32_t i = 0; i < kSlots; ++i) {
    uint64_t pid = field(slots()[i].pid).load();
    n += pid != 0 && pid != me && pid != kClearing;
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
  std::lock_guard lock(mu_);
  return counts_.empty() ? UINT64_MAX : counts_.begin()->first;
}

void ReaderPins::add(uint64_t generation) {
  std::lock_guard lock(mu_);
  ++counts_[generation];
  publish();
}

void ReaderPins::remove(uint64_t generation) {
  std::lock_guard lock(mu_);
  if (auto it = counts_.find(generation); it != counts_.end() && --it->second == 0)
    counts_.erase(it);
  publish();
}

void ReaderPins::publish() {
  if (!slot_) return;
  // Nothing pinned (between two pins of one handle): keep the last value, never raise it
  // past what a view may still read. A handle always holds a pin of its own generation.
  if (!counts_.empty()) table_->set_generation(slot_, counts_.begin()->first);
}

}  // namespace tdstore::storage
