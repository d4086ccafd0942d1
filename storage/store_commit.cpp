// Store: commit (the phases of docs/DESIGN.md, "Commit protocol"), refresh and remap of a
// reader, and the key index.

#include <algorithm>
#include <cstring>

#include "storage/catalog.h"
#include "storage/directory.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

void Store::commit() {
  require_writable("commit");
  if (txn_->in_group()) throw Error(dir_.string() + ": commit inside a write group");
  // Nothing staged: nothing to publish, unless a write undone since the last commit (a failed
  // set_ragged, an aborted group) retired arena space: a commit of no changes hands it back,
  // as every commit does with what its transaction retired.
  if (!has_staged_changes() && txn_->allocator().retired_count() == 0) return;
  {
    // The writer's last read transaction would pin every catalog page freed from now on.
    MutexLock lock(&catalog_mu_);
    writer_snapshot_.reset();
  }
  try {
    const uint64_t g = snap_->header.generation + 1;
    flush_pending();
    // Each phase is durable before the next begins; the header is the commit point.
    CommitVersions versions = write_slot_versions(g);  // 1. arena copies, synced
    uint64_t catalog_digest =                          // 2. catalog, one LMDB transaction
        snap_->header.format_version >= 2 ? snap_->header.catalog_digest : catalog_content_digest();
    catalog_digest ^= catalog_->write(txn_->meta(), g);
    write_inline_versions(versions);  // 3. inline versions and index entries, synced
    write_header(g, versions.digest, catalog_digest);  // 4. the commit point
    finish_commit(g);
  } catch (...) {
    txn_->set_broken();
    throw;
  }
}

// 1. Arena: tensor bytes are already written by put(); appends every new slot version, linked
//    to the version it replaces, then makes the arena durable.
Store::CommitVersions Store::write_slot_versions(uint64_t g) {
  const auto& staged = txn_->records();
  CommitVersions v;
  // The digest of generation g: the committed one with each changed slot's visible version
  // swapped for its new one (computed in full once, when upgrading a version-1 store).
  v.digest = snap_->header.format_version >= 2 ? snap_->header.dir_digest : directory_digest();
  v.targets.reserve(staged.size());
  v.records.reserve(staged.size());
  // Format 4: slots at or past slots_used are new in this commit, all zero on disk (recovery
  // zeroed what a failed commit left): neither read nor rewritten from the mapping.
  v.fresh_from = snap_->indexed ? snap_->header.slots_used : UINT64_MAX;
  for (const auto& [slot, rec] : staged) {
    int visible = -1;
    for (int i = 0; i < 2 && slot < v.fresh_from; ++i) {
      const SlotRecord& r = snap_->inline_record(slot, i);
      if (record_valid(r) && r.generation <= snap_->header.generation &&
          (visible < 0 || r.generation > snap_->inline_record(slot, visible).generation))
        visible = i;
    }
    if (visible >= 0) {
      txn_->retire(snap_->inline_record(slot, visible), &rec);  // its bytes, unless rec keeps them
      const SlotRecord& overwritten = snap_->inline_record(slot, 1 - visible);
      if (record_valid(overwritten) && overwritten.generation <= snap_->header.generation)
        txn_->allocator().retire(overwritten.self, sizeof(SlotRecord));  // its arena copy
    }
    SlotRecord r = rec;
    r.generation = g;
    r.prev = visible >= 0 ? snap_->inline_record(slot, visible).self : 0;
    // Copies are cut one by one (contiguous in a fresh run or the tail), so that small
    // free runs between live copies are reused too.
    r.self =
        txn_->allocate(sizeof(SlotRecord), alignof(SlotRecord) > 64 ? alignof(SlotRecord) : 64);
    seal(r);
    if (visible >= 0) v.digest ^= slot_digest(slot, snap_->inline_record(slot, visible));
    v.digest ^= slot_digest(slot, r);
    v.records.push_back(r);
    v.targets.emplace_back(slot, visible >= 0 ? 1 - visible : 0);
  }
  const auto& recs = v.records;
  for (size_t i = 0, j; i < recs.size(); i = j) {  // one write per contiguous group
    for (j = i + 1; j < recs.size() && recs[j].self == recs[j - 1].self + sizeof(SlotRecord); ++j) {
    }
    arena_file_->write_at(recs[i].self, &recs[i], (j - i) * sizeof(SlotRecord));
  }
  // The file must cover arena_end even when this commit wrote no bytes at its end (only
  // catalog changes, zero-byte tensors): readers treat a shorter arena as truncated.
  if (const uint64_t tail = txn_->allocator().tail(); arena_file_->size() < tail)
    arena_file_->truncate(tail);
  arena_file_->sync();
  return v;
}

// 3. Inline slot versions, never the one visible at the committed generation. Versions at most
//    kMaxGapBytes apart go out as one write of their range, the versions in between rewritten
//    with the bytes they hold (unchanged bytes stay unchanged even when a crash tears the
//    write), so a commit of many keys costs few writes. Format 4: then the new index entries, a
//    page range at a time (the entries in between rewritten with the values they hold). Then
//    makes the directory durable.
void Store::write_inline_versions(const CommitVersions& v) {
  constexpr uint64_t kMaxGapBytes = 4096;
  std::vector<std::pair<uint64_t, size_t>> writes;  // offset in keys.tdd, index into records
  writes.reserve(v.records.size());
  for (size_t i = 0; i < v.records.size(); ++i)
    writes.emplace_back(snap_->slot_at(v.targets[i].first, v.targets[i].second), i);
  std::sort(writes.begin(), writes.end());
  std::string range;
  for (size_t i = 0, j; i < writes.size(); i = j) {
    for (j = i + 1; j < writes.size() &&
                    writes[j].first - writes[j - 1].first - sizeof(SlotRecord) <= kMaxGapBytes;
         ++j) {
    }
    const uint64_t begin = writes[i].first, end = writes[j - 1].first + sizeof(SlotRecord);
    range.assign(end - begin, '\0');
    for (uint64_t o = begin; o < end; o += sizeof(SlotRecord))
      if (snap_->layout.slot_of(o).first < v.fresh_from)
        std::memcpy(range.data() + (o - begin), snap_->dir_map + o, sizeof(SlotRecord));
    for (size_t k = i; k < j; ++k)
      std::memcpy(range.data() + (writes[k].first - begin), &v.records[writes[k].second],
                  sizeof(SlotRecord));
    dir_file_->write_at(begin, range.data(), range.size());
  }
  std::vector<std::pair<uint64_t, uint64_t>> entries(txn_->new_index_entries().begin(),
                                                     txn_->new_index_entries().end());
  std::sort(entries.begin(), entries.end());
  for (auto it = entries.begin(); it != entries.end();) {
    const uint64_t first_page = index_entry_offset(it->first) / kPageSize;
    uint64_t last_page = first_page;
    auto end = it;
    for (; end != entries.end() && index_entry_offset(end->first) / kPageSize <= last_page + 1;
         ++end)
      last_page = index_entry_offset(end->first) / kPageSize;
    const uint64_t begin = first_page * kPageSize;
    const uint64_t stop = std::min((last_page + 1) * kPageSize, snap_->layout.base);
    range.assign(reinterpret_cast<const char*>(snap_->dir_map) + begin, stop - begin);
    for (; it != end; ++it) {
      const uint64_t e = it->second + 1;
      std::memcpy(range.data() + (index_entry_offset(it->first) - begin), &e, sizeof e);
    }
    dir_file_->write_at(begin, range.data(), range.size());
  }
  dir_file_->sync();
}

// 4. The header copy not holding the committed generation: the commit point.
void Store::write_header(uint64_t g, uint64_t dir_digest, uint64_t catalog_digest) {
  const WriteTxn& st = *txn_;
  DirHeader h = snap_->header;
  h.format_version = !snap_->indexed ? kHashedFormatVersion  // 1 and 2 become 3
                     : compressed_staged_ || h.format_version >= kCompressedFormatVersion
                         ? kCompressedFormatVersion
                         : kIndexedFormatVersion;
  if (snap_->indexed) h.slots_used += st.new_index_entries().size();
  h.generation = g;
  h.dir_digest = dir_digest;
  h.catalog_txn = catalog_->last_txnid();
  h.catalog_digest = catalog_digest;
  h.arena_end = st.allocator().tail();
  h.commit_time_ns = now_ns();
  h.live_keys = static_cast<uint64_t>(static_cast<int64_t>(h.live_keys) + st.keys_delta());
  h.live_bytes = static_cast<uint64_t>(static_cast<int64_t>(h.live_bytes) + st.bytes_delta());
  if (const auto& batch = st.batch_size()) {
    h.batch_ndim = static_cast<uint32_t>(batch->size());
    std::fill(std::begin(h.batch_size), std::end(h.batch_size), 0);
    std::copy(batch->begin(), batch->end(), h.batch_size);
  }
  seal(h);
  dir_file_->write_at(kHeaderCopyOffset[g % 2], &h, sizeof h);
  dir_file_->sync();
  Snapshot next = *snap_;
  next.adopt(h);
  publish(std::move(next));
}

// After the commit point: the handle reads generation g, and what the transaction retired
// becomes free once no reader can see it.
void Store::finish_commit(uint64_t g) {
  txn_->committed(g);
  compressed_staged_ = false;
}

void Store::continue_generations_from(uint64_t g) {
  require_writable("continue_generations_from");
  if (snap_->header.generation != 0 || g == 0)
    throw ArgumentError(dir_.string() + ": continue_generations_from needs a new store and g > 0");
  Snapshot next = *snap_;
  next.header.generation = g - 1;
  publish(std::move(next));
}

bool Store::refresh() {
  if (writable_) return false;
  if (swapped()) {
    // A compaction replaced the directory: move to the new store. Views of the old one keep
    // their mapping (Mapping is shared with them).
    {
      MutexLock lock(&catalog_mu_);
      catalog_snapshot_.reset();
    }
    catalog_.reset();
    publish(Snapshot::empty(dir_));
    open_files(OpenMode::ReadOnly);
    reset_key_index();
    return true;
  }
  bool moved = load_header();
  if (moved) {
    reset_key_index();
    remap();
  }
  return moved;
}

// A reader moving to a newer generation maps the arena afresh: the writer may have reused
// pages this process copied on write (in-place writes to views), whose private copies would
// hide the new bytes. Views of the old generation keep the old mapping and their pin.
void Store::remap() {
  if (snap_->header.arena_end > arena_reserve_)
    throw CapacityError(dir_.string() + ": arena holds " + std::to_string(snap_->header.arena_end) +
                        " bytes, more than arena_reserve " + std::to_string(arena_reserve_) +
                        "; open with a larger StoreOptions::arena_reserve");
  Snapshot next = *snap_;
  next.mapping = std::make_shared<Mapping>(*env_, *arena_file_, mapping_size());
  publish(std::move(next));
  if (pins_) current_pin_ = pins_->pin(snap_->header.generation, snap_->mapping);
}

// A writer reserves arena_reserve to grow into; a reader maps only the arena its generation
// uses (a refresh that moves it maps afresh), so a process can hold thousands of read handles.
uint64_t Store::mapping_size() const {
  if (writable_) return arena_reserve_;
  return std::min(arena_reserve_,
                  align_up(std::max(snap_->header.arena_end, kArenaDataOffset), kPageSize));
}

bool Store::swapped() const {
  const std::optional<FileIdentity> now = env_->identity(dir_ / kDirectoryFile);
  const std::optional<FileIdentity> mine = dir_file_->identity();
  return now && mine && *now != *mine;
}

const std::set<std::string, std::less<>>& Store::key_index() const {
  MutexLock lock(&index_mu_);  // const callers on several threads build it once
  if (!key_index_) {
    std::set<std::string, std::less<>> index;
    uint64_t companions = 0;
    for_each([&](std::string_view k, const Entry&) {
      index.emplace(k);
      companions += k.find('\0') != std::string_view::npos;
    });
    key_index_ = std::move(index);
    companions_ = companions;
  }
  return *key_index_;
}

void Store::reset_key_index() {
  MutexLock lock(&index_mu_);
  key_index_.reset();
}

uint64_t Store::key_count() const {
  const size_t keys = key_index().size();
  MutexLock lock(&index_mu_);
  return keys - companions_;
}

bool Store::has_prefix(std::string_view prefix) const {
  const auto& index = key_index();
  auto it = index.lower_bound(prefix);
  return it != index.end() && std::string_view(*it).substr(0, prefix.size()) == prefix;
}

}  // namespace tdstore::storage
