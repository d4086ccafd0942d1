// Store: the digests a header records and the checks of verify() and verify_structure().
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "storage/catalog.h"
#include "storage/checksum.h"
#include "storage/compact.h"
#include "storage/compressed.h"
#include "storage/directory.h"
#include "storage/durable_dirs.h"
#include "storage/graph_record.h"
#include "storage/graph_seal.h"
#include "storage/messages.h"
#include "storage/process.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

// DirHeader::catalog_digest as `snapshot` shows generation `gen`: the xor of content_digest()
// over the data records visible there (cache records are not versioned and not part of it).
uint64_t digest_at(const Catalog::Snapshot& snapshot, uint64_t gen) {
  uint64_t digest = 0;
  snapshot.scan(
      "", gen,
      [&](std::string_view k, std::string_view v) {
        if (k.substr(0, kCachePrefix.size()) != kCachePrefix) digest ^= content_digest(k, v);
      },
      [&](std::string_view k, const std::string& why) {  // damaged cache records are skipped
        if (k.substr(0, kCachePrefix.size()) != kCachePrefix) throw CorruptionError(why);
      });
  return digest;
}

uint64_t Store::catalog_content_digest() const {
  MutexLock lock(&catalog_mu_);
  return digest_at(versioned_snapshot(), snap_->header.generation);
}

uint64_t Store::directory_digest() const {
  uint64_t digest = 0;
  for (uint64_t s = 0; s < slot_limit(); ++s) {
    if (record_zero(snap_->inline_record(s, 0)) && record_zero(snap_->inline_record(s, 1)))
      continue;
    if (auto r = resolve(s, false)) digest ^= slot_digest(s, *r);
  }
  return digest;
}

// Compares the committed directory with what the header says of it: live keys, live bytes
// and (format version 2) the digest of every visible slot version. Empty when they agree.
std::string Store::check_directory(std::vector<uint64_t>* damaged_slots) const {
  uint64_t keys = 0, bytes = 0, digest = 0;
  std::vector<std::optional<uint64_t>> key_hash_of_slot(snap_->indexed ? snap_->header.slots_used
                                                                       : 0);
  for (uint64_t s = 0; s < snap_->header.slot_count; ++s) {
    if (record_zero(snap_->inline_record(s, 0)) && record_zero(snap_->inline_record(s, 1)))
      continue;
    bool damaged = false;
    auto r = resolve(s, false, &damaged);
    if (damaged && damaged_slots) damaged_slots->push_back(s);
    if (!r) continue;
    if (snap_->indexed && s >= snap_->header.slots_used)
      return "slot " + std::to_string(s) + " holds a version of generation " +
             std::to_string(r->generation) + " but only " +
             std::to_string(snap_->header.slots_used) + " slots are in use at generation " +
             std::to_string(snap_->header.generation) + " (slots altered)";
    if (snap_->indexed) key_hash_of_slot[s] = r->key_hash;
    digest ^= slot_digest(s, *r);
    if (r->state == static_cast<uint8_t>(SlotState::Live)) {
      ++keys;
      bytes += r->data_nbytes;
    }
  }
  const std::string g = " at generation " + std::to_string(snap_->header.generation);
  if (keys != snap_->header.live_keys)
    return "the header counts " + std::to_string(snap_->header.live_keys) + " live keys" + g +
           ", the slots hold " + std::to_string(keys) + " (slots lost or altered)";
  if (bytes != snap_->header.live_bytes)
    return "the header counts " + std::to_string(snap_->header.live_bytes) + " live bytes" + g +
           ", the slots hold " + std::to_string(bytes) + " (slots lost or altered)";
  if (snap_->header.format_version >= 2 && digest != snap_->header.dir_digest)
    return "the slots do not match the directory digest" + g + " (slots lost or altered)";
  return snap_->indexed ? check_index(key_hash_of_slot) : "";
}

// Format 4: every slot in use is named by exactly one index entry, no entry names a slot past
// slot_count, and each slot's key reaches its entry by probing (no empty position between the
// key's home position and the entry). Entries naming slots at or past slots_used belong to a
// newer commit (a reader's view) and count as empty.
std::string Store::check_index(const std::vector<std::optional<uint64_t>>& key_hash_of_slot) const {
  const uint64_t n = snap_->header.slot_count, mask = n - 1, used = snap_->header.slots_used;
  std::vector<uint64_t> position_of(used, UINT64_MAX);
  std::vector<uint64_t> entries(n);
  for (uint64_t p = 0; p < n; ++p) entries[p] = snap_->load_index_entry(p);
  uint64_t named = 0;
  for (uint64_t p = 0; p < n; ++p) {
    uint64_t e = entries[p];
    if (e == 0) continue;
    if (e > n)
      return "key index position " + std::to_string(p) + " names slot " + std::to_string(e - 1) +
             ", past the " + std::to_string(n) + " slots (index altered)";
    if (e > used) {
      entries[p] = 0;
      continue;
    }
    if (position_of[e - 1] != UINT64_MAX)
      return "key index positions " + std::to_string(position_of[e - 1]) + " and " +
             std::to_string(p) + " both name slot " + std::to_string(e - 1) + " (index altered)";
    position_of[e - 1] = p;
    ++named;
  }
  if (named != used)
    return "the key index names " + std::to_string(named) + " of the " + std::to_string(used) +
           " slots in use at generation " + std::to_string(snap_->header.generation) +
           " (index entries lost)";
  // run[p]: occupied positions ending at p (probing from any of them reaches p).
  uint64_t start = 0;
  while (start < n && entries[start] != 0) ++start;
  if (start == n) return "";  // a full index: every probe visits every position
  std::vector<uint64_t> run(n, 0);
  for (uint64_t i = 1; i <= n; ++i) {
    uint64_t p = (start + i) & mask;
    run[p] = entries[p] ? run[(p - 1) & mask] + 1 : 0;
  }
  for (uint64_t s = 0; s < used; ++s) {
    const uint64_t p = position_of[s];
    if (!key_hash_of_slot[s]) continue;  // empty at this generation (lost slots are reported above)
    if (((p - *key_hash_of_slot[s]) & mask) >= run[p])
      return "key index position " + std::to_string(p) + " names slot " + std::to_string(s) +
             ", which its key's probe from position " +
             std::to_string(*key_hash_of_slot[s] & mask) + " never reaches (index altered)";
  }
  return "";
}

std::vector<std::string> Store::verify(const std::vector<std::string>& keys) const {
  Verification v = check(keys);
  v.corrupt.insert(v.corrupt.end(), v.structure.begin(), v.structure.end());
  return v.corrupt;
}

Store::Verification Store::check(const std::vector<std::string>& keys,
                                 const std::function<void(uint64_t, uint64_t)>& progress) const {
  constexpr uint64_t kHashPiece = 64 << 20;  // hashed in pieces so that progress moves
  flush_pending();
  std::vector<std::pair<std::string, Entry>> todo;
  if (keys.empty()) {
    for_each([&](std::string_view k, const Entry& e) { todo.emplace_back(k, e); });
  } else {
    for (const auto& k : keys) {
      auto e = find(k);
      if (!e) throw KeyError(dir_.string() + ": key " + in_quotes(k) + " not found");
      todo.emplace_back(k, *e);
    }
  }
  Verification v;
  v.checked = todo.size();
  for (const auto& [k, e] : todo) v.bytes += e.nbytes;
  // The stored bytes, not this process's view of them: the handle's mapping is private, and an
  // in-place write to a view (copy on write) changes only this process's pages. A shared,
  // read-only mapping of the file sees the page cache, i.e. what the file holds.
  const uint8_t* base = snap_->mapping->base();
  const uint64_t limit = arena_size();  // all of the file, also past this handle's reservation
  std::unique_ptr<Region> shared;
  if (limit) {
    shared = env_->map(*arena_file_, static_cast<size_t>(limit), Env::MapMode::SharedRead);
    base = shared->data();
  }
  uint64_t done = 0;
  for (const auto& [k, e] : todo) {
    if (e.capacity && (e.offset > limit || limit - e.offset < e.nbytes)) {
      v.corrupt.push_back(k);
      if (progress) progress(done += e.nbytes, v.bytes);
      continue;
    }
    Xxh3Stream h;
    for (uint64_t off = 0; off < e.nbytes; off += kHashPiece) {
      const uint64_t n = std::min<uint64_t>(kHashPiece, e.nbytes - off);
      h.update(base + e.offset + off, n);
      if (progress) progress(done += n, v.bytes);
    }
    if (h.digest() != e.content_hash) {
      v.corrupt.push_back(k);
    } else if (e.compressed()) {  // intact bytes, yet blocks a reader could not use
      try {
        const auto* object = base + e.offset;
        auto idx = read_index(object, e.nbytes, *row_layout(e.shape, dtype_size(e.dtype)), k);
        if (!check_blocks(object, idx).empty()) v.corrupt.push_back(k);
      } catch (const CorruptionError&) {
        v.corrupt.push_back(k);
      }
    }
  }
  if (keys.empty()) v.structure = verify_structure();
  return v;
}

std::vector<std::string> Store::verify_structure() const {
  std::vector<std::string> bad;
  std::vector<uint64_t> damaged;
  if (snap_->damaged_header >= 0)
    bad.push_back("/directory/header copy " + std::to_string(snap_->damaged_header) +
                  " fails its checksum (it may have held a newer commit than generation " +
                  std::to_string(snap_->header.generation) + ")");
  if (std::string why = check_directory(&damaged); !why.empty())
    bad.push_back("/directory: " + why);
  for (uint64_t s : damaged) bad.push_back("/directory/slot " + std::to_string(s));
  uint64_t digest = 0;
  MutexLock lock(&catalog_mu_);
  versioned_snapshot().scan(  // a reader's snapshot pinned with its header: it holds generation's
                              // versions
      "", snap_->header.generation,
      [&](std::string_view k, std::string_view v) {
        if (k.substr(0, kCachePrefix.size()) != kCachePrefix) {
          digest ^= content_digest(k, v);
          return;
        }
        try {  // the framing only: whether libtorch accepts the archive is the loader's question
          // (and whether its seal holds, the question of a user who holds the key)
          Unsealed u = unseal(v, k, Keyring{});
          if (u.status == SealStatus::Altered) throw CorruptionError("its seal is cut short");
          if (u.status != SealStatus::Newer) decode_graph_record(u.record, std::string(k));
        } catch (const CorruptionError& e) {
          bad.push_back("/catalog/" + std::string(k) + ": " + e.what());
        }
      },
      [&](std::string_view k, const std::string&) { bad.push_back("/catalog/" + std::string(k)); });
  if (snap_->header.format_version >= 2 && digest != snap_->header.catalog_digest && bad.empty())
    bad.push_back("/catalog: its records do not match generation " +
                  std::to_string(snap_->header.generation) +
                  "'s digest (records lost, altered or rolled back)");
  return bad;
}

void Store::corrupt(const std::string& what) const { snap_->corrupt(what); }

}  // namespace tdstore::storage
