#include "storage/graph_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "storage/graph_seal.h"
#include "storage/keyring.h"
#include "storage/mutex.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;
namespace {

std::optional<std::string> get_cache(const Store& s, std::string_view key) {
  std::optional<std::string> out;
  s.visit_cache(key, [&](std::string_view k, std::string_view v) {
    if (k == key) out = std::string(v);
  });
  return out;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// "" when the graph cache at dir and its catalog are this user's and closed to others' writes;
// else why not.
std::string not_private(const fs::path& dir) {
  for (const fs::path& p : {dir, dir / "catalog", dir / "catalog" / "data.mdb"}) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) continue;  // opening it says what is wrong
    if (st.st_uid != ::geteuid())
      return p.string() + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user";
    if (st.st_mode & 022) return p.string() + " may be written by its group or others";
  }
  return "";
}

bool same_store(const Store& a, const Store& b) {
  std::error_code ec;
  return fs::equivalent(a.path(), b.path(), ec);
}

// The process's handle on this user's graph cache, opened (and created) on first use. Never
// destroyed: a process's last compiled call may come during exit.
struct UserCache {
  Mutex mu;
  Store* store GUARDED_BY(mu) = nullptr;
  std::string failure GUARDED_BY(mu);  // why it cannot be opened, once tried

  Store* get(std::string* why) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (!store && failure.empty()) open();
    if (!store && why) *why = failure;
    return store;
  }

 private:
  void open() REQUIRES(mu) {
    const Keyring& keys = Keyring::process();
    if (keys.cache_dir.empty()) {
      failure = "no home directory and no XDG_CACHE_HOME";
      return;
    }
    const fs::path dir = keys.cache_dir / "graphs";
    // Two attempts: another process may create it between this one's look and create.
    for (int attempt = 0; attempt < 2 && !store; ++attempt) {
      std::error_code ec;
      if (!fs::exists(dir / "catalog", ec)) {
        try {
          // Private: its graphs are code this user runs, and may hold constants of its data.
          if (fs::create_directories(keys.cache_dir, ec)) ::chmod(keys.cache_dir.c_str(), 0700);
          StoreOptions o;
          o.key_capacity = 1;
          Store::create(dir, {}, o).reset();
        } catch (const std::exception& ex) {
          failure = dir.string() + ": " + ex.what();
          continue;  // another process may have created it meanwhile
        }
      }
      if (std::string why = not_private(dir); !why.empty()) {
        failure = why + ": not used (remove it; the next run creates it anew)";
        return;
      }
      try {
        store = Store::open(dir, OpenMode::ReadOnly, {}).release();
      } catch (const std::exception& ex) {
        failure = dir.string() + ": " + ex.what();
      }
    }
    if (store) failure.clear();
  }
};

}  // namespace

Store* user_graph_cache(std::string* why) {
  static UserCache* const cache = new UserCache;
  return cache->get(why);
}

std::vector<TrustedRecord> load_trusted_graphs(
    Store& store, std::string_view prefix,
    const std::function<void(const std::string&, const fs::path&, const std::string&)>& refused) {
  const Keyring& keys = Keyring::process();
  std::vector<TrustedRecord> out;
  auto take = [&](Store& s) {
    std::vector<std::tuple<std::string, std::string>> passed;
    std::vector<std::string> damaged;
    s.visit_cache(
        prefix,
        [&](std::string_view k, std::string_view v) {
          if (std::any_of(out.begin(), out.end(), [&](const auto& r) { return r.key == k; }))
            return;
          Unsealed u = unseal(v, k, keys);
          if (u.status == SealStatus::Trusted)
            out.push_back({std::string(k), std::string(u.record), s.path()});
          else
            passed.emplace_back(std::string(k), describe(u));
        },
        &damaged);
    for (auto& k : damaged)
      passed.emplace_back(k, "a damaged catalog record (`tdstore cache --clear` removes it)");
    for (auto& [k, why] : passed) refused(k, s.path(), why);
  };
  take(store);
  if (Store* cache = user_graph_cache(nullptr); cache && !same_store(*cache, store)) take(*cache);
  return out;
}

fs::path put_trusted_graph(Store& store, std::string_view key, std::string_view record) {
  const Keyring& keys = Keyring::process();
  if (!keys.signing)
    throw IOError("no signing key: " +
                  (keys.refused.empty() ? std::string("(none found)") : keys.refused.front()));
  const std::string value = seal(*keys.signing, key, record, now_ns());
  bool into_store = store.cache_writable();
  if (into_store)
    if (auto old = get_cache(store, key)) into_store = replaceable(unseal(*old, key, keys), keys);
  if (into_store) {
    store.put_cache(key, value);
    return store.path();
  }
  std::string why;
  Store* cache = user_graph_cache(&why);
  if (!cache) throw IOError("this user's graph cache is not available: " + why);
  cache->put_cache(key, value);
  trim_graph_cache(*cache, graph_cache_budget(), key);
  return cache->path();
}

void erase_own_graph(Store& store, std::string_view key) {
  const Keyring& keys = Keyring::process();
  auto erase = [&](Store& s) {
    if (!s.cache_writable()) return;
    auto old = get_cache(s, key);
    if (old && replaceable(unseal(*old, key, keys), keys)) s.put_cache(key, std::nullopt);
  };
  erase(store);
  if (Store* cache = user_graph_cache(nullptr); cache && !same_store(*cache, store)) erase(*cache);
}

uint64_t graph_cache_budget() {
  constexpr uint64_t kDefault = uint64_t{1} << 30;
  const char* v = std::getenv("TDSTORE_GRAPH_CACHE_BYTES");
  if (!v || !*v) return kDefault;
  uint64_t n = 0;
  for (const char* c = v; *c; ++c) {
    if (*c < '0' || *c > '9' || n > (UINT64_MAX - 9) / 10) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "tdstore: TDSTORE_GRAPH_CACHE_BYTES=%s is not a byte count; the graph "
                     "cache keeps its default budget of 1 GiB\n",
                     v);
      });
      return kDefault;
    }
    n = n * 10 + static_cast<uint64_t>(*c - '0');
  }
  return n;
}

uint64_t trim_graph_cache(Store& cache, uint64_t budget, std::string_view keep) {
  // The catalog's pages bound its records' bytes from above: below the budget, nothing to do
  // (O(1), so that a write costs no scan while the cache is small).
  if (cache.catalog_bytes() <= budget) return 0;
  struct Item {
    uint64_t written_ns, bytes;
    std::string key;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  std::vector<std::string> doomed;  // damaged catalog values first
  cache.visit_cache(
      kCachePrefix,
      [&](std::string_view k, std::string_view v) {
        Unsealed u = unseal(v, k, Keyring{});  // only the time is read: no key needed
        if (k != keep) items.push_back({u.written_ns, v.size() + k.size(), std::string(k)});
        total += v.size() + k.size();
      },
      &doomed);
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.written_ns < b.written_ns; });
  for (const auto& it : items) {
    if (total <= budget) break;
    doomed.push_back(it.key);
    total -= it.bytes;
  }
  cache.erase_cache(doomed);
  return doomed.size();
}

}  // namespace tdstore::storage
