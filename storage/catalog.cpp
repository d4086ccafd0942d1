#include "storage/catalog.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "storage/checksum.h"
#include "storage/messages.h"
#include "storage/process.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

constexpr size_t kInitialMapSize = size_t{64} << 20;

// LMDB reports a short write (a full disk, the file-size limit) as EIO: say which it was.
std::string write_context(const std::filesystem::path& dir, int rc) {
  if (rc != EIO && rc != ENOSPC && rc != EFBIG) return "";
  std::string out;
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) == 0 &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < (uint64_t{1} << 20))
    out += " (No space left on device: " +
           std::to_string(static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize) + " bytes free)";
  struct rlimit lim;
  struct stat st;
  if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      ::stat((dir / "data.mdb").c_str(), &st) == 0 &&
      static_cast<rlim_t>(st.st_size) + (uint64_t{1} << 20) >= lim.rlim_cur)
    out += " (File too large: data.mdb is " + std::to_string(st.st_size) +
           " bytes, the file-size limit is " + std::to_string(lim.rlim_cur) + ")";
  return out;
}

[[noreturn]] void fail(const std::filesystem::path& dir, std::string_view call, int rc) {
  std::string msg =
      dir.string() + ": " + std::string(call) + ": " + mdb_strerror(rc) + write_context(dir, rc);
  if (rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND)
    throw CorruptionError(msg);
  if (rc == MDB_VERSION_MISMATCH) throw FormatError(msg);
  throw IOError(msg);
}

// A versioned value: up to two versions, newest first. Encoding (docs/FORMAT.md):
//   repeated { u64 generation, u8 present, u32 length, bytes[length] }
struct Version {
  uint64_t gen;
  bool present;
  std::string value;
};

// Format 2 values start with this tag and end with the xxh3 of the key and the versions; a
// value without the tag is a format-1 value (no checksum). As a format-1 generation the tag
// would be about 2^62: never reached.
constexpr char kValueTag[8] = {'T', 'D', 'C', 'V', '2', 0, 0, 0};

}  // namespace

uint64_t content_digest(std::string_view key, std::string_view value) {
  Xxh3Stream h;
  const uint64_t n = key.size();
  h.update(&n, 8);
  h.update(key.data(), key.size());
  h.update(value.data(), value.size());
  return h.digest();
}

namespace {

std::vector<Version> decode(std::string_view v, const std::filesystem::path& dir,
                            std::string_view key) {
  auto damaged = [&](const char* what) {
    return CorruptionError(dir.string() + ": catalog entry " + in_quotes(std::string(key)) + " " +
                           what);
  };
  if (v.size() >= 16 && std::memcmp(v.data(), kValueTag, 8) == 0) {
    uint64_t sum;
    std::memcpy(&sum, v.data() + v.size() - 8, 8);
    v = v.substr(8, v.size() - 16);
    if (sum != content_digest(key, v)) throw damaged("fails its checksum");
  }
  std::vector<Version> out;
  size_t p = 0;
  while (p < v.size()) {
    if (v.size() - p < 13) throw damaged("is truncated");
    Version ver;
    uint32_t len;
    std::memcpy(&ver.gen, v.data() + p, 8);
    ver.present = v[p + 8] != 0;
    std::memcpy(&len, v.data() + p + 9, 4);
    p += 13;
    if (v.size() - p < len) throw damaged("is truncated");
    ver.value.assign(v.data() + p, len);
    p += len;
    out.push_back(std::move(ver));
  }
  return out;
}

std::string encode(std::string_view key, const std::vector<Version>& versions) {
  std::string body;
  for (const auto& v : versions) {
    char head[13];
    auto len = static_cast<uint32_t>(v.value.size());
    std::memcpy(head, &v.gen, 8);
    head[8] = v.present ? 1 : 0;
    std::memcpy(head + 9, &len, 4);
    body.append(head, 13).append(v.value);
  }
  const uint64_t sum = content_digest(key, body);
  std::string out(kValueTag, 8);
  out += body;
  out.append(reinterpret_cast<const char*>(&sum), 8);
  return out;
}

const Version* visible(const std::vector<Version>& versions, uint64_t gen) {
  const Version* best = nullptr;
  for (const auto& v : versions)
    if (v.gen <= gen && (!best || v.gen > best->gen)) best = &v;
  return best;
}

// LMDB maps data.mdb and trusts its page numbers: in a damaged file one can point past the end,
// and touching it raises SIGBUS. Every LMDB call that reads the map runs through mapped(): a
// SIGBUS or SIGSEGV (a page past the map) or an LMDB assertion inside it returns MDB_CORRUPTED
// instead, so the damage is a CorruptionError. The calls hold no C++ objects, so jumping out of
// them skips no destructor; the transaction is then only aborted. A fault elsewhere goes to the
// previous handler.
thread_local sigjmp_buf* tl_jump = nullptr;
struct sigaction previous_sigbus, previous_sigsegv;

void on_fault(int sig, siginfo_t*, void*) {
  if (tl_jump) siglongjmp(*tl_jump, 1);
  // Not ours: restore the previous disposition; the faulting access repeats under it.
  sigaction(sig, sig == SIGBUS ? &previous_sigbus : &previous_sigsegv, nullptr);
}

void on_assert(MDB_env*, const char*) {
  if (tl_jump) siglongjmp(*tl_jump, 1);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous_sigbus);
    sigaction(SIGSEGV, &sa, &previous_sigsegv);  // a page number past the whole map
  });
}

template <class F>
int mapped(F&& call) {
  sigjmp_buf jump;
  sigjmp_buf* outer = tl_jump;
  if (sigsetjmp(jump, 1) != 0) {
    tl_jump = outer;
    return MDB_CORRUPTED;
  }
  tl_jump = &jump;
  int rc = call();
  tl_jump = outer;
  return rc;
}

// The bytes of a value or key LMDB returned (a view into the map), copied under mapped().
std::string copied(const MDB_val& v, const std::filesystem::path& dir) {
  std::string out;
  int rc = mapped([&] {
    out.assign(static_cast<const char*>(v.mv_data), v.mv_size);
    return 0;
  });
  if (rc)
    throw CorruptionError(dir.string() + ": catalog page out of the file (data.mdb is damaged)");
  return out;
}

MDB_val val(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }
std::string_view view(const MDB_val& v) { return {static_cast<const char*>(v.mv_data), v.mv_size}; }

struct Registry {
  std::mutex mu;
  pid_t pid = 0;
  std::map<std::string, std::weak_ptr<Catalog>> open;
};
Registry& registry() {
  static Registry* r = new Registry;  // leaked: environments must outlive static destruction
  return *r;
}

}  // namespace

std::shared_ptr<Catalog> Catalog::open(const std::filesystem::path& dir, bool writable, bool create,
                                       bool no_lock) {
  install_sigbus_handler();
  auto& reg = registry();
  std::lock_guard lock(reg.mu);
  if (reg.pid != ::getpid()) {
    // A forked child must not touch its parent's environments: forget (and leak) them.
    for (auto& [path, weak] : reg.open)
      if (auto c = weak.lock()) new std::shared_ptr<Catalog>(c);
    reg.open.clear();
    reg.pid = ::getpid();
  }
  // Keyed by the identity of data.mdb, not by a path: after a compaction swaps directories the
  // same path names a different catalog. Not by the directory's identity either: an open
  // environment keeps data.mdb's inode from being reused, not the directory's, and a store
  // deleted and created again at one path may get the old directory's inode number.
  if (create) {
    std::error_code ec;
    std::filesystem::create_directory(dir, ec);
    if (ec) throw IOError(dir.string() + ": cannot create the catalog directory: " + ec.message());
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) throw FormatError(dir.string() + ": no catalog (not a tdstore store)");
    throw_io_error(dir, "stat");
  }
  auto key_of = [](const struct stat& s) {
    return std::to_string(s.st_dev) + ":" + std::to_string(s.st_ino);
  };
  if (::stat((dir / "data.mdb").c_str(), &st) == 0) {
    if (auto it = reg.open.find(key_of(st)); it != reg.open.end()) {
      if (auto c = it->second.lock()) {
        if (writable && !c->writable_)
          throw IOError(dir.string() + ": catalog is not writable (read-only files)");
        return c;
      }
    }
  }
  std::shared_ptr<Catalog> c(new Catalog);
  c->dir_ = dir;
  c->pid_ = process_id();
  // A failed mdb_env_open requires mdb_env_close: each attempt gets a fresh environment.
  auto attempt = [&](unsigned flags) {
    int rc = mdb_env_create(&c->env_);
    if (rc) fail(dir, "mdb_env_create", rc);
    mdb_env_set_assert(c->env_, on_assert);
    mdb_env_set_mapsize(c->env_, kInitialMapSize);
    mdb_env_set_maxreaders(
        c->env_,
        8192);  // read transactions of every process: more than the reader table's 4096 processes
    rc = mapped([&] { return mdb_env_open(c->env_, dir.c_str(), flags, 0644); });
    if (rc) {
      mdb_env_close(c->env_);
      c->env_ = nullptr;
    }
    return rc;
  };
  // Opened read-write whenever the files allow it, so that readers and a writer in one process
  // share the environment; MDB_RDONLY only on read-only files. Without a writable lock file a
  // reader cannot register: it reads without one (MDB_NOLOCK), which is safe while no writer
  // commits (docs/DESIGN.md).
  c->writable_ = !no_lock;
  int rc = no_lock ? attempt(MDB_NOTLS | MDB_RDONLY | MDB_NOLOCK) : attempt(MDB_NOTLS);
  if ((rc == EACCES || rc == EROFS) && !writable) {
    c->writable_ = false;
    rc = attempt(MDB_NOTLS | MDB_RDONLY);
    if (rc == EACCES || rc == EROFS) rc = attempt(MDB_NOTLS | MDB_RDONLY | MDB_NOLOCK);
  }
  if (rc) {
    if (rc == ENOENT) throw FormatError(dir.string() + ": no catalog (not a tdstore store)");
    fail(dir, "mdb_env_open", rc);
  }
  // Every page LMDB may touch must lie inside data.mdb: a truncated file would be a SIGBUS in
  // the first transaction instead of an error.
  {
    MDB_envinfo info;
    MDB_stat st;
    mdb_env_info(c->env_, &info);
    mdb_env_stat(c->env_, &st);
    struct stat fst;
    const auto data = dir / "data.mdb";
    if (::stat(data.c_str(), &fst) == 0 &&
        static_cast<uint64_t>(fst.st_size) <
            (static_cast<uint64_t>(info.me_last_pgno) + 1) * st.ms_psize)
      throw CorruptionError(
          data.string() + ": truncated: " + std::to_string(fst.st_size) +
          " bytes, its meta page uses " +
          std::to_string((static_cast<uint64_t>(info.me_last_pgno) + 1) * st.ms_psize));
  }
  if (c->writable_) {
    int dead = 0;
    mdb_reader_check(c->env_, &dead);  // clear slots of killed readers
  }
  MDB_txn* txn = c->begin(c->writable_ ? 0 : MDB_RDONLY);
  rc = mapped([&] { return mdb_dbi_open(txn, nullptr, 0, &c->dbi_); });
  if (rc) {
    mdb_txn_abort(txn);
    fail(dir, "mdb_dbi_open", rc);
  }
  rc = mapped([&] { return mdb_txn_commit(txn); });
  if (rc) fail(dir, "mdb_txn_commit", rc);
  // A new environment's meta pages are written by mdb_env_open and synced by nothing until its
  // first write transaction, which a store without attributes may never run: sync them now.
  if (create && (rc = mdb_env_sync(c->env_, 1)) != 0) fail(dir, "mdb_env_sync", rc);
  c->self_ = c;
  mdb_filehandle_t fd;
  if (mdb_env_get_fd(c->env_, &fd) != 0 || ::fstat(fd, &st) != 0)
    throw_os_error(dir, "cannot identify data.mdb", errno);
  std::erase_if(reg.open, [](const auto& entry) { return entry.second.expired(); });
  reg.open[key_of(st)] = c;
  return c;
}

// In a forked child the environment and its transactions are the parent's: closing or aborting
// them would release the parent's LMDB reader slots (shared memory), so they are left alone.
Catalog::~Catalog() {
  if (env_ && pid_ == process_id()) mdb_env_close(env_);
}

MDB_txn* Catalog::begin(unsigned flags) {
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env_, nullptr, flags, &txn);
  if (rc == MDB_MAP_RESIZED) {  // another process grew the map
    mdb_env_set_mapsize(env_, 0);
    rc = mdb_txn_begin(env_, nullptr, flags, &txn);
  }
  if (rc) fail(dir_, "mdb_txn_begin", rc);
  return txn;
}

void Catalog::grow() {
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  int rc = mdb_env_set_mapsize(env_, info.me_mapsize * 2);
  if (rc) fail(dir_, "mdb_env_set_mapsize", rc);
}

std::unique_ptr<Catalog::Snapshot> Catalog::snapshot() {
  return std::unique_ptr<Snapshot>(new Snapshot(self_.lock(), begin(MDB_RDONLY)));
}

Catalog::Snapshot::~Snapshot() {
  if (owner_->pid_ == process_id()) mdb_txn_abort(txn_);
}

void Catalog::Snapshot::renew() {
  mdb_txn_reset(txn_);
  int rc = mdb_txn_renew(txn_);
  if (rc == MDB_MAP_RESIZED) {
    mdb_txn_abort(txn_);
    txn_ = owner_->begin(MDB_RDONLY);
    return;
  }
  if (rc) fail(owner_->dir_, "mdb_txn_renew", rc);
}

std::optional<std::string> Catalog::Snapshot::get(std::string_view key, uint64_t gen) const {
  MDB_val k = val(key), v;
  int rc = mapped([&] { return mdb_get(txn_, owner_->dbi_, &k, &v); });
  if (rc == MDB_NOTFOUND) return std::nullopt;
  if (rc) fail(owner_->dir_, "mdb_get", rc);
  auto versions = decode(copied(v, owner_->dir_), owner_->dir_, key);
  const Version* best = visible(versions, gen);
  if (!best || !best->present) return std::nullopt;
  return best->value;
}

void Catalog::Snapshot::scan(
    std::string_view prefix, uint64_t gen,
    const std::function<void(std::string_view, std::string_view)>& fn,
    const std::function<void(std::string_view, const std::string&)>& damaged) const {
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn_, owner_->dbi_, &cur);
  if (rc) fail(owner_->dir_, "mdb_cursor_open", rc);
  MDB_val k = val(prefix), v;
  try {
    // LMDB keys are never empty: an empty prefix starts at the first key.
    for (rc = mapped([&] {
           return mdb_cursor_get(cur, &k, &v, prefix.empty() ? MDB_FIRST : MDB_SET_RANGE);
         });
         rc == 0; rc = mapped([&] { return mdb_cursor_get(cur, &k, &v, MDB_NEXT); })) {
      const std::string key_bytes = copied(k, owner_->dir_);
      std::string_view key = key_bytes;
      if (key.substr(0, prefix.size()) != prefix) break;
      std::vector<Version> versions;
      try {
        versions = decode(copied(v, owner_->dir_), owner_->dir_, key);
      } catch (const CorruptionError& e) {
        if (!damaged) throw;
        damaged(key, e.what());
        continue;
      }
      const Version* best = visible(versions, gen);
      if (best && best->present) fn(key, best->value);
    }
  } catch (...) {
    mdb_cursor_close(cur);
    throw;
  }
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND && rc != 0) fail(owner_->dir_, "mdb_cursor_get", rc);
}

uint64_t Catalog::write(const std::map<std::string, std::optional<std::string>>& changes,
                        uint64_t gen) {
  if (changes.empty()) return 0;
  MutexLock lock(&mu_);
  for (;;) {
    MDB_txn* txn = begin(0);
    int rc = 0;
    uint64_t delta = 0;  // content digest change (data records only)
    try {
      for (const auto& [key, value] : changes) {
        MDB_val k = val(key), v;
        std::vector<Version> keep;
        rc = mapped([&] { return mdb_get(txn, dbi_, &k, &v); });
        if (rc != 0 && rc != MDB_NOTFOUND) break;
        // Cache entries (gen 0) have a single version, replaced unread.
        if (rc == 0 && gen != 0) {
          auto versions = decode(copied(v, dir_), dir_, key);
          if (const Version* prev = visible(versions, gen - 1)) {
            keep.push_back(*prev);
            if (prev->present) delta ^= content_digest(key, prev->value);
          }
        }
        rc = 0;
        if (gen == 0 && !value) {  // deleting a cache entry removes it
          rc = mapped([&] { return mdb_del(txn, dbi_, &k, nullptr); });
          if (rc == MDB_NOTFOUND) rc = 0;
          if (rc) break;
          continue;
        }
        if (gen != 0 && value) delta ^= content_digest(key, *value);
        std::vector<Version> next{{gen, value.has_value(), value.value_or("")}};
        next.insert(next.end(), keep.begin(), keep.end());
        std::string enc = encode(key, next);
        MDB_val nv = val(enc);
        rc = mapped([&] { return mdb_put(txn, dbi_, &k, &nv, 0); });
        if (rc) break;
      }
    } catch (...) {
      mdb_txn_abort(txn);
      throw;
    }
    if (rc == 0)
      rc = mapped([&] { return mdb_txn_commit(txn); });
    else
      mdb_txn_abort(txn);
    if (rc == MDB_MAP_FULL) {
      grow();
      continue;
    }
    if (rc) fail(dir_, "catalog write", rc);
    return delta;
  }
}

void Catalog::recover(uint64_t committed, std::string_view cache_prefix) {
  MutexLock lock(&mu_);
  MDB_txn* txn = begin(0);
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn, dbi_, &cur);
  if (rc) fail(dir_, "mdb_cursor_open", rc);
  bool changed = false;
  MDB_val k, v;
  for (rc = mapped([&] { return mdb_cursor_get(cur, &k, &v, MDB_FIRST); }); rc == 0;
       rc = mapped([&] { return mdb_cursor_get(cur, &k, &v, MDB_NEXT); })) {
    std::vector<Version> versions;
    try {
      versions = decode(copied(v, dir_), dir_, copied(k, dir_));
    } catch (const CorruptionError&) {
      if (view(k).substr(0, cache_prefix.size()) == cache_prefix) continue;
      mdb_cursor_close(cur);
      mdb_txn_abort(txn);
      throw;
    }
    std::vector<Version> keep;
    for (auto& ver : versions)
      if (ver.gen <= committed) keep.push_back(std::move(ver));
    if (keep.size() == versions.size()) continue;
    changed = true;
    if (keep.empty()) {
      mdb_cursor_del(cur, 0);
    } else {
      std::string enc = encode(view(k), keep);
      MDB_val nv = val(enc);
      mapped([&] { return mdb_cursor_put(cur, &k, &nv, MDB_CURRENT); });
    }
  }
  mdb_cursor_close(cur);
  rc = changed ? mapped([&] { return mdb_txn_commit(txn); }) : (mdb_txn_abort(txn), 0);
  if (rc) fail(dir_, "catalog recovery", rc);
}

uint64_t Catalog::entries() {
  MDB_txn* txn = begin(MDB_RDONLY);
  MDB_stat st;
  mapped([&] { return mdb_stat(txn, dbi_, &st); });
  mdb_txn_abort(txn);
  return st.ms_entries;
}

uint64_t Catalog::used_bytes() {
  MDB_txn* txn = begin(MDB_RDONLY);
  MDB_stat st;
  mapped([&] { return mdb_stat(txn, dbi_, &st); });
  mdb_txn_abort(txn);
  return (st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages) * uint64_t{st.ms_psize};
}

std::optional<std::string> catalog_value_at(std::string_view key, std::string_view record,
                                            uint64_t gen) {
  auto versions = decode(record, "<record>", key);
  const Version* v = visible(versions, gen);
  if (!v || !v->present) return std::nullopt;
  return v->value;
}

uint64_t Catalog::last_txnid() const {
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  return info.me_last_txnid;
}

}  // namespace tdstore::storage
