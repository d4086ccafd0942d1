#include "storage/compact.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "storage/compressed.h"
#include "storage/messages.h"
#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

void remove_dead_siblings(const fs::path& dir_in) {
  fs::path dir = fs::absolute(dir_in).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  std::error_code ec;
  const std::string name = dir.filename().string();
  for (const auto& e : fs::directory_iterator(dir.parent_path(), ec)) {
    const std::string f = e.path().filename().string();
    for (const char* kind : {".compact.", ".creating."}) {
      const std::string stem = name + kind;
      if (f.size() <= stem.size() || f.compare(0, stem.size(), stem) != 0) continue;
      // "<dir><kind><pid>", or the store a killed compaction was creating under that name:
      // "<dir>.compact.<pid>.creating.<pid>" (one process, one pid).
      std::string rest = f.substr(stem.size());
      const std::string pid = rest.substr(0, rest.find_first_not_of("0123456789"));
      rest = rest.substr(pid.size());
      if (pid.empty() || pid.size() > 9 ||
          !(rest.empty() || (std::string(kind) == ".compact." && rest == ".creating." + pid)))
        continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // alive
      fs::remove_all(e.path(), ec);
    }
  }
}

CompactResult compact(const fs::path& dir_in, const StoreOptions& options,
                      const std::function<void(uint64_t, uint64_t)>& progress, int64_t key_capacity,
                      const std::optional<Compression>& compression) {
  fs::path dir = fs::absolute(dir_in).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  CompactResult result;
  auto old = Store::open(dir, OpenMode::ReadWrite, options);  // the writer lock, held to the end
  remove_dead_siblings(dir);
  StoreInfo info = old->info();
  result.arena_before = info.arena_end;

  fs::path tmp = dir;
  tmp += ".compact." + std::to_string(::getpid());
  if (key_capacity != 0 &&
      (key_capacity < 0 || static_cast<uint64_t>(key_capacity) < info.live_keys))
    throw ArgumentError(dir.string() + ": compact to key_capacity " + std::to_string(key_capacity) +
                        ": the store holds " + std::to_string(info.live_keys) +
                        " live keys (ragged keys count twice); ask for at least that many");
  StoreOptions o = options;
  o.key_capacity = key_capacity ? key_capacity : static_cast<int64_t>(info.key_capacity);
  o.alignment = static_cast<int64_t>(info.alignment);
  auto fresh = Store::create(tmp, info.batch_size, o);
  fresh->continue_generations_from(info.generation + 1);

  if (compression && compression->enabled()) check_compression(*compression, dir.string());
  uint64_t done = 0;
  old->for_each([&](std::string_view key, const Entry& e) {
    const auto* data = static_cast<const uint8_t*>(old->view(e).data);
    const std::string where = dir.string() + ": key " + in_quotes(key);
    const auto layout = row_layout(e.shape, dtype_size(e.dtype));
    if (compression) {  // every key rewritten under it, from its raw bytes
      std::string raw;
      if (e.compressed()) {
        const BlockIndex idx = read_index(data, e.nbytes, *layout, where);  // before allocating
        raw.resize(e.raw_nbytes);
        read_rows(data, idx, 0, layout->rows, raw.data(), where);
        data = reinterpret_cast<const uint8_t*>(raw.data());
      }
      const uint64_t raw_capacity =
          e.nbytes ? static_cast<uint64_t>(static_cast<long double>(e.capacity) * e.raw_nbytes /
                                           e.nbytes)
                   : e.raw_nbytes;
      const auto flags = static_cast<uint8_t>(e.flags & ~kSlotCompressed);
      if (compression->enabled())
        fresh->put_compressed(key, e.dtype, e.shape, data, e.raw_nbytes, *compression, raw_capacity,
                              flags);
      else
        fresh->put(key, e.dtype, e.shape, data, e.raw_nbytes, raw_capacity, flags);
    } else {  // as stored (a compressed key with what its appends left behind: its checksum,
              // which lazy-property fingerprints hold, stays the same)
      fresh->put(key, e.dtype, e.shape, data, e.nbytes, e.capacity, e.flags);
    }
    done += e.nbytes;
    ++result.keys;
    if (progress) progress(done, info.live_bytes);
  });
  for (auto& [k, v] : old->scan_meta("")) {
    if (k.starts_with(kCachePrefix))
      fresh->put_cache(k, v);
    else
      fresh->put_meta(k, v);
  }
  if (compression) fresh->put_attr(kCompressionAttr, compression->text());
  fresh->commit();
  result.arena_after = fresh->info().arena_end;
  result.generation = fresh->generation();

  auto env = options.env ? options.env : Env::posix();
  try {
    env->exchange(tmp, dir);
  } catch (const IOError&) {
    fresh.reset();
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  env->sync_dir(dir.parent_path());
  fresh.reset();
  old.reset();
  std::error_code ec;
  fs::remove_all(tmp, ec);  // now the old store
  return result;
}

}  // namespace tdstore::storage

namespace tdstore {

CompactResult compact(const std::filesystem::path& dir, const CompactOptions& options) {
  if (options.key_capacity && *options.key_capacity <= 0)
    throw ArgumentError(dir.string() + ": compact to key_capacity " +
                        std::to_string(*options.key_capacity) +
                        ": the capacity must be at least 1");
  auto r = storage::compact(dir, {}, options.progress, options.key_capacity.value_or(0),
                            options.compression);
  return {static_cast<int64_t>(r.keys), r.arena_before, r.arena_after, r.generation};
}

}  // namespace tdstore
