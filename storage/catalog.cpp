#include "storage/catalog.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

constexpr size_t kInitialMapSize = size_t{64} << 20;

[[noreturn]] void fail(const std::filesystem::path& dir, std::string_view call, int rc) {
  std::string msg = dir.string() + ": " + std::string(call) + ": " + mdb_strerror(rc);
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

std::vector<Version> decode(std::string_view v, const std::filesystem::path& dir,
                            std::string_view key) {
  std::vector<Version> out;
  size_t p = 0;
  while (p < v.size()) {
    if (v.size() - p < 13) throw CorruptionError(dir.string() + ": catalog entry '" +
                                                 std::string(key) + "' is truncated");
    Version ver;
    uint32_t len;
    std::memcpy(&ver.gen, v.data() + p, 8);
    ver.present = v[p + 8] != 0;
    std::memcpy(&len, v.data() + p + 9, 4);
    p += 13;
    if (v.size() - p < len) throw CorruptionError(dir.string() + ": catalog entry '" +
                                                  std::string(key) + "' is truncated");
    ver.value.assign(v.data() + p, len);
    p += len;
    out.push_back(std::move(ver));
  }
  return out;
}

std::string encode(const std::vector<Version>& versions) {
  std::string out;
  for (const auto& v : versions) {
    char head[13];
    auto len = static_cast<uint32_t>(v.value.size());
    std::memcpy(head, &v.gen, 8);
    head[8] = v.present ? 1 : 0;
    std::memcpy(head + 9, &len, 4);
    out.append(head, 13).append(v.value);
  }
  return out;
}

const Version* visible(const std::vector<Version>& versions, uint64_t gen) {
  const Version* best = nullptr;
  for (const auto& v : versions)
    if (v.gen <= gen && (!best || v.gen > best->gen)) best = &v;
  return best;
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

std::shared_ptr<Catalog> Catalog::open(const std::filesystem::path& dir, bool writable,
                                       bool create, bool no_lock) {
  auto& reg = registry();
  std::lock_guard lock(reg.mu);
  if (reg.pid != ::getpid()) {
    // A forked child must not touch its parent's environments: forget (and leak) them.
    for (auto& [path, weak] : reg.open)
      if (auto c = weak.lock()) new std::shared_ptr<Catalog>(c);
    reg.open.clear();
    reg.pid = ::getpid();
  }
  // Keyed by the directory's identity, not its path: after a compaction swaps directories,
  // the same path names a different catalog.
  if (create) std::filesystem::create_directory(dir);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) throw FormatError(dir.string() + ": no catalog (not a tdstore store)");
    throw IOError(dir.string() + ": stat failed: " + std::strerror(errno));
  }
  std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  if (auto it = reg.open.find(key); it != reg.open.end()) {
    if (auto c = it->second.lock()) {
      if (writable && !c->writable_)
        throw IOError(dir.string() + ": catalog is not writable (read-only files)");
      return c;
    }
  }
  std::shared_ptr<Catalog> c(new Catalog);
  c->dir_ = dir;
  // A failed mdb_env_open requires mdb_env_close: each attempt gets a fresh environment.
  auto attempt = [&](unsigned flags) {
    int rc = mdb_env_create(&c->env_);
    if (rc) fail(dir, "mdb_env_create", rc);
    mdb_env_set_mapsize(c->env_, kInitialMapSize);
    mdb_env_set_maxreaders(c->env_, 1024);
    rc = mdb_env_open(c->env_, dir.c_str(), flags, 0644);
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
        static_cast<uint64_t>(fst.st_size) < (static_cast<uint64_t>(info.me_last_pgno) + 1) * st.ms_psize)
      throw CorruptionError(data.string() + ": truncated: " + std::to_string(fst.st_size) + " bytes, its meta page uses " +
                            std::to_string((static_cast<uint64_t>(info.me_last_pgno) + 1) * st.ms_psize));
  }
  if (c->writable_) {
    int dead = 0;
    mdb_reader_check(c->env_, &dead);  // clear slots of killed readers
  }
  MDB_txn* txn = c->begin(c->writable_ ? 0 : MDB_RDONLY);
  rc = mdb_dbi_open(txn, nullptr, 0, &c->dbi_);
  if (rc) {
    mdb_txn_abort(txn);
    fail(dir, "mdb_dbi_open", rc);
  }
  rc = mdb_txn_commit(txn);
  if (rc) fail(dir, "mdb_txn_commit", rc);
  c->self_ = c;
  reg.open[key] = c;
  return c;
}

Catalog::~Catalog() {
  if (env_) mdb_env_close(env_);
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

Catalog::Snapshot::~Snapshot() { mdb_txn_abort(txn_); }

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
  int rc = mdb_get(txn_, owner_->dbi_, &k, &v);
  if (rc == MDB_NOTFOUND) return std::nullopt;
  if (rc) fail(owner_->dir_, "mdb_get", rc);
  auto versions = decode(view(v), owner_->dir_, key);
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
  // LMDB keys are never empty: an empty prefix starts at the first key.
  for (rc = mdb_cursor_get(cur, &k, &v, prefix.empty() ? MDB_FIRST : MDB_SET_RANGE); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    std::string_view key = view(k);
    if (key.substr(0, prefix.size()) != prefix) break;
    std::vector<Version> versions;
    try {
      versions = decode(view(v), owner_->dir_, key);
    } catch (const CorruptionError& e) {
      if (!damaged) {
        mdb_cursor_close(cur);
        throw;
      }
      damaged(key, e.what());
      continue;
    }
    const Version* best = visible(versions, gen);
    if (best && best->present) fn(key, best->value);
  }
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND && rc != 0) fail(owner_->dir_, "mdb_cursor_get", rc);
}

void Catalog::write(const std::map<std::string, std::optional<std::string>>& changes,
                    uint64_t gen) {
  if (changes.empty()) return;
  std::lock_guard lock(mu_);
  for (;;) {
    MDB_txn* txn = begin(0);
    int rc = 0;
    for (const auto& [key, value] : changes) {
      MDB_val k = val(key), v;
      std::vector<Version> keep;
      rc = mdb_get(txn, dbi_, &k, &v);
      if (rc != 0 && rc != MDB_NOTFOUND) break;
      // Cache entries (gen 0) have a single version, replaced unread.
      if (rc == 0 && gen != 0) {
        auto versions = decode(view(v), dir_, key);
        if (const Version* prev = visible(versions, gen - 1)) keep.push_back(*prev);
      }
      rc = 0;
      if (gen == 0 && !value) {  // deleting a cache entry removes it
        rc = mdb_del(txn, dbi_, &k, nullptr);
        if (rc == MDB_NOTFOUND) rc = 0;
        if (rc) break;
        continue;
      }
      std::vector<Version> next{{gen, value.has_value(), value.value_or("")}};
      next.insert(next.end(), keep.begin(), keep.end());
      std::string enc = encode(next);
      MDB_val nv = val(enc);
      rc = mdb_put(txn, dbi_, &k, &nv, 0);
      if (rc) break;
    }
    if (rc == 0) rc = mdb_txn_commit(txn);
    else mdb_txn_abort(txn);
    if (rc == MDB_MAP_FULL) {
      grow();
      continue;
    }
    if (rc) fail(dir_, "catalog write", rc);
    return;
  }
}

void Catalog::recover(uint64_t committed, std::string_view cache_prefix) {
  std::lock_guard lock(mu_);
  MDB_txn* txn = begin(0);
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn, dbi_, &cur);
  if (rc) fail(dir_, "mdb_cursor_open", rc);
  bool changed = false;
  MDB_val k, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    std::vector<Version> versions;
    try {
      versions = decode(view(v), dir_, view(k));
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
      std::string enc = encode(keep);
      MDB_val nv = val(enc);
      mdb_cursor_put(cur, &k, &nv, MDB_CURRENT);
    }
  }
  mdb_cursor_close(cur);
  rc = changed ? mdb_txn_commit(txn) : (mdb_txn_abort(txn), 0);
  if (rc) fail(dir_, "catalog recovery", rc);
}

uint64_t Catalog::entries() {
  MDB_txn* txn = begin(MDB_RDONLY);
  MDB_stat st;
  mdb_stat(txn, dbi_, &st);
  mdb_txn_abort(txn);
  return st.ms_entries;
}

uint64_t Catalog::last_txnid() const {
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  return info.me_last_txnid;
}

}  // namespace tdstore::storage
