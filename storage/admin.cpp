// tdstore/admin.h over storage::Store: every answer comes from the key directory and the
// catalog, never from tensors.
#include "tdstore/admin.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "storage/append_plan.h"
#include "storage/checksum.h"
#include "storage/compressed.h"
#include "storage/dataset_manifest.h"
#include "storage/derived.h"
#include "storage/format.h"
#include "storage/graph_meta.h"
#include "storage/graph_record.h"
#include "storage/graph_seal.h"
#include "storage/import_rows.h"
#include "storage/messages.h"
#include "storage/records.h"
#include "storage/store.h"
#include "tdstore/errors.h"
#include "tdstore/keys.h"

namespace tdstore {
namespace {

namespace fs = std::filesystem;
using storage::Entry;
using storage::in_quotes;
using storage::shape_text;
using storage::Store;

bool is_companion(std::string_view k) { return k.find('\0') != std::string_view::npos; }

// Every stored tensor by display name: a ragged key's offsets show as "<key> (offsets)".
std::map<std::string, Entry> tensors_of(const Store& s) {
  std::map<std::string, Entry> out;
  s.for_each([&](std::string_view k, const Entry& e) {
    std::string name(k.substr(0, k.find('\0')));
    if (is_companion(k)) name += " (offsets)";
    out.emplace(std::move(name), e);
  });
  return out;
}

std::set<std::string> lazy_keys(const Store& s) {
  std::set<std::string> out;
  for (const auto& [k, v] : s.scan_meta(storage::kLazyPrefix))
    out.insert(k.substr(storage::kLazyPrefix.size()));
  return out;
}

// What a graph record's meta says it reads (docs/FORMAT.md, "graph/"): its reads that
// succeeded, a dynamic dim 0 as *.
void describe_graph(const storage::GraphMeta& meta, GraphEntry& g) {
  g.dynamic_dim0 = meta.dynamic_dim0;
  for (const auto& o : meta.observations) {
    if (o.kind != storage::GraphObservation::Kind::Read || o.error) continue;
    std::string sizes;
    for (int64_t d : o.spec.sizes)
      sizes += (sizes.empty() ? "" : ",") + (d == -1 ? std::string("*") : std::to_string(d));
    g.reads.push_back(o.key + " " + o.spec.dtype + "[" + sizes + "]");
  }
}

}  // namespace

struct TDSTORE_HIDDEN StoreReader::Impl {
  std::unique_ptr<Store> store;

  EntryInfo info_of(std::string_view key, const Entry& e, const std::set<std::string>& lazy) const {
    EntryInfo i;
    i.key = std::string(key);
    i.dtype = e.dtype;
    i.shape = e.shape;
    i.offset = e.offset;
    i.nbytes = e.nbytes;
    i.raw_nbytes = e.raw_nbytes;
    i.compressed = e.compressed();
    i.capacity = e.capacity;
    i.xxh3 = e.content_hash;
    i.generation = e.generation;
    i.ragged = (e.flags & storage::kSlotRagged) != 0;
    i.lazy = lazy.count(i.key) > 0;
    if (i.ragged)
      if (auto o = store->find(storage::ragged_offsets_key(key)))
        i.offsets_nbytes = o->nbytes, i.offsets_xxh3 = o->content_hash;
    return i;
  }

  Entry require(std::string_view key) const {
    auto e = is_companion(key) ? std::nullopt : store->find(key);
    if (!e) throw KeyError(store->path().string() + ": key " + in_quotes(key) + " not found");
    return *e;
  }

  Array array_of(std::string_view key, const Entry& e) const {
    Array a;
    a.dtype = e.dtype;
    a.shape = e.shape;
    a.nbytes = e.raw_nbytes;
    if (e.compressed()) {           // decompressed into memory the array owns
      store->check_stored(key, e);  // its raw size is one its stored bytes can hold
      // Not zero-filled, and in huge pages where the kernel has them: the decompression writes
      // every byte, on the cores it splits the blocks among, one page fault per 2 MiB.
      std::shared_ptr<uint8_t[]> bytes(new uint8_t[std::max<uint64_t>(e.raw_nbytes, 1)]);
      if (e.raw_nbytes >= (uint64_t{2} << 20))
        Env::posix()->advise(bytes.get(), e.raw_nbytes, Env::Advice::HugePages);
      store->read_rows(key, e, 0, storage::row_layout(e.shape, dtype_size(e.dtype))->rows,
                       bytes.get());
      a.data = bytes.get();
      a.owner = std::move(bytes);
      return a;
    }
    auto view = store->view(e);
    a.data = view.data;
    a.owner = std::move(view.pin);
    return a;
  }

  // The lazy-property rule's facts (storage/derived.h) as the stored records tell them.
  struct StoredLazyFacts final : storage::LazyFacts {
    const Impl& impl;
    explicit StoredLazyFacts(const Impl& i) : impl(i) {}
    std::optional<uint64_t> fingerprint(std::string_view key, int) const override {
      return storage::key_fingerprint(*impl.store, key);
    }
    std::optional<bool> lazy_valid(std::string_view key, int depth) const override {
      auto v = impl.store->get_meta(std::string(storage::kLazyPrefix) + std::string(key));
      if (!v) return std::nullopt;
      return impl.lazy_valid(std::string(key), storage::parse_lazy_record(*v, impl.where(key)),
                             depth);
    }
  };

  bool lazy_valid(const std::string& key, const storage::LazyRecord& r, int depth) const {
    std::vector<std::pair<std::string, uint64_t>> deps;
    for (const auto& d : r.deps) deps.emplace_back(d.key, d.fingerprint);
    return storage::lazy_valid(
        r.fingerprint && storage::key_fingerprint(*store, key) == r.fingerprint, deps, depth,
        StoredLazyFacts(*this));
  }

  std::string where(std::string_view key) const {
    return store->path().string() + ": catalog entry " + std::string(storage::kLazyPrefix) +
           std::string(key);
  }
};

StoreReader::StoreReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreReader::StoreReader(StoreReader&&) noexcept = default;
StoreReader& StoreReader::operator=(StoreReader&&) noexcept = default;
StoreReader::~StoreReader() = default;

StoreReader StoreReader::open(const fs::path& dir, const StoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->store = Store::open(dir, OpenMode::ReadOnly, options);
  return StoreReader(std::move(impl));
}

const fs::path& StoreReader::path() const { return impl_->store->path(); }

StoreSummary StoreReader::summary() const {
  const Store& s = *impl_->store;
  const storage::StoreInfo i = s.info();
  const storage::SpaceInfo sp = s.space();
  StoreSummary out;
  out.path = s.path();
  out.format_version = i.format_version;
  out.generation = i.generation;
  out.committed_at_ns = static_cast<int64_t>(i.commit_time_ns);
  out.batch_size = i.batch_size;
  out.keys = s.key_count();
  out.key_slots_used = i.live_keys;
  out.key_capacity = i.key_capacity;
  out.tensor_bytes = i.live_bytes;
  out.arena_bytes_used = i.arena_end;
  out.arena_bytes_on_disk = i.arena_file_size;
  out.arena_bytes_allocated = sp.allocated_bytes;
  out.arena_bytes_reserved = i.arena_reserve;
  out.arena_bytes_reusable = sp.reusable_bytes;
  out.arena_bytes_pending = sp.pending_bytes;
  out.arena_bytes_reclaimable =
      i.arena_end - std::min<uint64_t>(i.arena_end, i.live_bytes + storage::kArenaDataOffset);
  out.readers = sp.readers;
  out.alignment = i.alignment;
  auto catalog = s.scan_meta("");
  out.catalog_entries = catalog.size();
  for (const auto& [k, v] : catalog) {
    out.attributes += k.rfind("attr/", 0) == 0;
    out.lazy_properties += k.rfind(storage::kLazyPrefix, 0) == 0;
  }
  out.compiled_graphs = s.scan_cache(storage::kCachePrefix).size();
  return out;
}

std::vector<EntryInfo> StoreReader::entries(std::string_view prefix) const {
  const Store& s = *impl_->store;
  const auto lazy = lazy_keys(s);
  const auto& index = s.key_index();
  std::string under(prefix);
  if (!under.empty() && under.back() != '/') under += '/';
  std::vector<EntryInfo> out;
  auto add = [&](const std::string& k) {
    if (auto e = s.find(k)) out.push_back(impl_->info_of(k, *e, lazy));
  };
  if (!prefix.empty() && prefix.back() != '/' && index.count(prefix)) add(std::string(prefix));
  for (auto it = index.lower_bound(under);
       it != index.end() && it->compare(0, under.size(), under) == 0; ++it)
    if (!is_companion(*it)) add(*it);
  std::sort(out.begin(), out.end(),
            [](const EntryInfo& a, const EntryInfo& b) { return a.key < b.key; });
  return out;
}

std::optional<EntryInfo> StoreReader::find(std::string_view key) const {
  if (is_companion(key)) return std::nullopt;
  auto e = impl_->store->find(key);
  if (!e) return std::nullopt;
  return impl_->info_of(key, *e, lazy_keys(*impl_->store));
}

Array StoreReader::read(std::string_view key) const {
  return impl_->array_of(key, impl_->require(key));
}

Array StoreReader::read_offsets(std::string_view key) const {
  Entry e = impl_->require(key);
  auto o = (e.flags & storage::kSlotRagged) ? impl_->store->find(storage::ragged_offsets_key(key))
                                            : std::nullopt;
  if (!o) throw KeyError(path().string() + ": key " + in_quotes(key) + " is not ragged");
  return impl_->array_of(storage::ragged_offsets_key(key), *o);
}

Array StoreReader::read_dense(std::string_view key) const {
  Entry e = impl_->require(key);
  if (!(e.flags & storage::kSlotRagged)) return impl_->array_of(key, e);
  const Array values = impl_->array_of(key, e), offsets = read_offsets(key);
  const std::string what = path().string() + ": ragged key " + in_quotes(key);
  if (offsets.dtype != DType::Int64 || offsets.shape.size() != 1 || offsets.shape[0] < 1 ||
      values.shape.empty())
    throw CorruptionError(what +
                          ": offsets are not int64 [rows + 1] beside values of at least one dim");
  const auto* off = static_cast<const int64_t*>(offsets.data);
  const int64_t n = offsets.shape[0] - 1;
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > values.shape[0])
      throw CorruptionError(what + ": offsets[" + std::to_string(i + 1) +
                            "] = " + std::to_string(off[i + 1]) + " is out of order or past the " +
                            std::to_string(values.shape[0]) + " values");
    longest = std::max(longest, off[i + 1] - off[i]);
  }
  const uint64_t item =
      values.shape[0] ? values.nbytes / static_cast<uint64_t>(values.shape[0]) : 0;
  Array out;
  out.dtype = values.dtype;
  out.shape = {n, longest};
  out.shape.insert(out.shape.end(), values.shape.begin() + 1, values.shape.end());
  out.nbytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(longest) * item;
  std::shared_ptr<uint8_t[]> bytes(new uint8_t[std::max<uint64_t>(out.nbytes, 1)]());
  const auto* src = static_cast<const uint8_t*>(values.data);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(bytes.get() + static_cast<uint64_t>(i * longest) * item,
                src + static_cast<uint64_t>(off[i]) * item,
                static_cast<uint64_t>(off[i + 1] - off[i]) * item);
  out.data = bytes.get();
  out.owner = std::move(bytes);
  return out;
}

VerifyReport StoreReader::verify(const std::vector<std::string>& keys,
                                 const std::function<void(uint64_t, uint64_t)>& progress) const {
  // Names as this API shows them ("<key> (offsets)" for a ragged key's offsets) to store keys
  // and back.
  std::map<std::string, std::string> key_of;
  std::map<std::string, std::string, std::less<>> name_of;
  impl_->store->for_each([&](std::string_view k, const Entry&) {
    std::string name(k.substr(0, k.find('\0')));
    if (is_companion(k)) name += " (offsets)";
    key_of.emplace(name, k);
    name_of.emplace(std::string(k), std::move(name));
  });
  std::vector<std::string> store_keys;
  for (const auto& k : keys) {
    auto it = key_of.find(k);
    if (it == key_of.end())
      throw KeyError(path().string() + ": key " + in_quotes(k) + " not found");
    store_keys.push_back(it->second);
  }
  Store::Verification v = impl_->store->check(store_keys, progress);
  VerifyReport r;
  r.checked = v.checked;
  r.bytes = v.bytes;
  for (const auto& k : v.corrupt) r.corrupt.push_back(name_of.at(k));
  for (auto& problem : v.structure) {
    if (problem.rfind("/catalog/", 0) == 0)
      r.damaged_catalog.push_back(problem.substr(9));
    else
      r.damaged_structure.push_back(std::move(problem));
  }
  return r;
}

std::vector<std::string> StoreReader::attribute_names() const { return impl_->store->attr_names(); }

std::optional<std::string> StoreReader::attribute(std::string_view name) const {
  return impl_->store->get_attr(name);
}

std::vector<LazyProvenance> StoreReader::lazy_properties() const {
  std::vector<LazyProvenance> out;
  for (const auto& [k, v] : impl_->store->scan_meta(storage::kLazyPrefix)) {
    std::string key = k.substr(storage::kLazyPrefix.size());
    storage::LazyRecord r = storage::parse_lazy_record(v, impl_->where(key));
    LazyProvenance p;
    p.key = key;
    p.version = r.version;
    for (const auto& d : r.deps) p.deps.push_back({d.key, d.fingerprint, d.checksum});
    p.computed_at_ns = r.computed_at_ns;
    p.compute_ns = r.compute_ns;
    p.valid = impl_->lazy_valid(key, r, 0);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<GraphEntry> StoreReader::graphs(std::string_view function,
                                            std::vector<std::string>* damaged) const {
  std::string prefix =
      std::string(storage::kCachePrefix) + (function.empty() ? "" : std::string(function) + "/");
  std::vector<GraphEntry> out;
  for (const auto& [k, v] : impl_->store->scan_cache(prefix, damaged)) {
    storage::GraphMeta meta;
    // Listed, never loaded: the meta of a record of any signer is parsed as data.
    storage::Unsealed u = storage::unseal(v, k, storage::Keyring::process());
    try {
      if (u.status == storage::SealStatus::Altered && u.signer.empty())
        throw CorruptionError("its seal is cut short");
      if (u.status != storage::SealStatus::Newer)  // a newer seal's record may be framed anew
        meta = storage::parse_graph_meta(storage::decode_graph_record(u.record, k).meta);
    } catch (const CorruptionError&) {
      if (damaged) damaged->push_back(k);
      continue;
    }
    GraphEntry g;
    g.key = k;
    static const char* const kTrust[] = {"trusted", "unsigned", "foreign", "altered", "newer"};
    g.trust = kTrust[static_cast<int>(u.status)];
    g.signer = u.signer;
    std::vector<std::string> parts = split_key(k);  // graph/<function>/<code id>/<libtorch>/<guard>
    std::string* fields[] = {&g.function, &g.code_id, &g.torch_version, &g.guard};
    for (size_t i = 0; i < 4 && i + 1 < parts.size(); ++i) *fields[i] = parts[i + 1];
    g.bytes = v.size();
    describe_graph(meta, g);
    out.push_back(std::move(g));
  }
  return out;
}

bool StoreReader::refresh() { return impl_->store->refresh(); }

StoreDiff diff(const fs::path& a, const fs::path& b) {
  auto sa = Store::open(a, OpenMode::ReadOnly, {});
  auto sb = Store::open(b, OpenMode::ReadOnly, {});
  auto ea = tensors_of(*sa), eb = tensors_of(*sb);
  StoreDiff d;
  d.keys = ea.size();
  for (const auto& [k, e] : ea) {
    auto it = eb.find(k);
    if (it == eb.end())
      d.removed.push_back(k);
    else if (it->second.dtype != e.dtype || it->second.shape != e.shape)
      d.spec_changed.push_back({k, e.dtype, it->second.dtype, e.shape, it->second.shape});
    else if (it->second.content_hash != e.content_hash)
      d.content_changed.push_back(k);
  }
  for (const auto& [k, e] : eb)
    if (!ea.count(k)) d.added.push_back(k);
  return d;
}

bool is_dataset(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "manifest" / storage::kDirectoryFile, ec);
}

DatasetInfo dataset_info(const fs::path& dir) {
  if (!is_dataset(dir))
    throw FormatError(dir.string() + ": not a dataset (no manifest store at " +
                      (dir / "manifest").string() + ")");
  auto manifest = Store::open(dir / "manifest", OpenMode::ReadOnly, {});
  auto text = manifest->get_attr(storage::kManifestAttr);
  if (!text)
    throw FormatError(dir.string() + ": not a dataset (its manifest has no '" +
                      storage::kManifestAttr + "' attribute)");
  storage::Manifest m = storage::parse_manifest(*text, dir.string());
  DatasetInfo info;
  info.path = dir;
  info.row_shape = m.row_shape;
  for (const auto& [shard, rows] : m.shards) {
    info.shards.push_back({shard, rows, dir / "shards" / storage::shard_dir_name(shard)});
    info.rows += rows;
  }
  if (fs::exists(dir / "features" / storage::kDirectoryFile)) info.features = dir / "features";
  return info;
}

ClearResult clear_graphs(const fs::path& dir, std::string_view function) {
  auto store = Store::open(dir, OpenMode::ReadOnly, {});
  std::string prefix =
      std::string(storage::kCachePrefix) + (function.empty() ? "" : std::string(function) + "/");
  std::vector<std::string> damaged;
  auto entries = store->scan_cache(prefix, &damaged);
  uint64_t undecodable = damaged.size();
  for (const auto& [k, v] : entries) {
    try {
      storage::Unsealed u = storage::unseal(v, k, storage::Keyring{});
      if (u.status == storage::SealStatus::Altered) throw CorruptionError("its seal is cut short");
      if (u.status != storage::SealStatus::Newer)
        storage::parse_graph_meta(storage::decode_graph_record(u.record, k).meta);
    } catch (const CorruptionError&) {
      ++undecodable;
    }
    store->put_cache(k, std::nullopt);
  }
  for (const auto& k : damaged) store->put_cache(k, std::nullopt);
  return {entries.size() + damaged.size(), undecodable};
}

bool invalidate_lazy(const fs::path& dir, std::string_view key) {
  auto store = Store::open(dir, OpenMode::ReadWrite, {});
  const std::string meta = std::string(storage::kLazyPrefix) + std::string(key);
  if (!store->get_meta(meta)) return false;
  store->put_meta(meta, std::nullopt);
  store->commit();
  return true;
}

ImportResult import_arrays(const fs::path& dir, const std::map<std::string, Array>& arrays,
                           bool append, const std::optional<Compression>& compression) {
  return storage::import_rows(dir, arrays, append, compression, 0);
}

int64_t storage::shared_rows(const std::string& w, const std::map<std::string, Array>& arrays) {
  if (arrays.empty()) throw ArgumentError(w + ": import: nothing to import");
  int64_t rows = -1;
  for (const auto& [k, a] : arrays) {
    if (a.shape.empty())
      throw ShapeError(w + ": import: " + in_quotes(k) +
                       " is 0-d; imported arrays share batch dim 0");
    if (rows >= 0 && a.shape[0] != rows)
      throw ShapeError(w + ": import: " + in_quotes(k) + " has " + std::to_string(a.shape[0]) +
                       " rows, others have " + std::to_string(rows));
    rows = a.shape[0];
  }
  return rows;
}

ImportResult storage::import_rows(const fs::path& dir, const std::map<std::string, Array>& arrays,
                                  bool append, const std::optional<Compression>& compression,
                                  int64_t reserve_rows, const ImportChunks& chunks) {
  const std::string w = dir.string();
  const int64_t rows = shared_rows(w, arrays);
  if (compression && compression->enabled()) storage::check_compression(*compression, w);
  std::error_code ec;
  const bool exists = fs::exists(dir / storage::kDirectoryFile, ec);
  auto store = exists ? Store::open(dir, OpenMode::ReadWrite, {})
                      : Store::create(dir, {append ? 0 : rows}, {});
  ImportResult result;
  result.keys = arrays.size();
  result.rows = rows - chunks.from;
  Compression c;  // what the keys this import creates are stored under
  if (compression) {
    c = *compression;
    if (!exists) store->put_attr(storage::kCompressionAttr, c.text());
  } else if (auto recorded = store->get_attr(storage::kCompressionAttr)) {
    try {
      c = Compression::parse(*recorded);
    } catch (const ArgumentError&) {
      throw CorruptionError(w + ": the recorded default compression " + in_quotes(*recorded) +
                            " is not one this build reads");
    }
  }
  // The files arrays lie in, opened once: raw keys are copied from them in the kernel and
  // compared with them as they land, compressed keys read from them by the threads compressing
  // the rows (storage::Payload).
  std::map<fs::path, std::unique_ptr<File>> files;
  auto file_of = [&](const Array& a) -> File* {
    if (a.file.empty()) return nullptr;
    auto& f = files[a.file];
    if (!f) f = Env::posix()->open(a.file, Env::Access::ReadOnly);
    return f.get();
  };
  try {
    if (!append) {
      for (const auto& [k, a] : arrays)
        if (c.enabled())
          store->put_compressed(k, a.dtype, a.shape,
                                storage::Payload{a.data, a.nbytes, file_of(a), a.file_offset}, c);
        else
          store->put(k, a.dtype, a.shape,
                     storage::Payload{a.data, a.nbytes, file_of(a), a.file_offset});
    } else {
      // Row chunks [at, at + step), each appended and (when chunked) committed, through this
      // one handle: the running checksum of an appended key is not recomputed per chunk.
      const int64_t step = chunks.rows > 0 ? chunks.rows : std::max<int64_t>(rows, 1);
      int64_t at = chunks.from;
      do {
        const int64_t end = std::min(rows, at + step);
        const std::vector<int64_t> batch = store->batch_size();
        if (batch.size() != 1)
          throw ShapeError(
              w + ": import --append: rows extend batch dim 0 of a store with one batch dim, not " +
              std::to_string(batch.size()));
        std::map<std::string, storage::ColumnSpec> current, theirs;
        for (const auto& k : store->key_index())
          if (!is_companion(k)) {
            const Entry e = *store->find(k);
            current[k] = {e.dtype, e.shape, (e.flags & storage::kSlotRagged) != 0};
          }
        std::vector<storage::AppendPart> parts;
        for (const auto& [k, a] : arrays) {
          const uint64_t row = a.shape[0] ? a.nbytes / static_cast<uint64_t>(a.shape[0]) : 0;
          std::vector<int64_t> shape = a.shape;
          shape[0] = end - at;
          theirs[k] = {a.dtype, shape, false};
          const uint64_t skip = static_cast<uint64_t>(at) * row;
          File* file = file_of(a);
          const uint8_t* data = static_cast<const uint8_t*>(a.data) + skip;
          const uint64_t nbytes = static_cast<uint64_t>(end - at) * row;
          parts.push_back({k, a.dtype, shape, data, nbytes,
                           static_cast<uint64_t>(std::max<int64_t>(reserve_rows, 0)) * row, 0, file,
                           a.file_offset + skip});
          // Rows from a file are copied (raw keys) or read (compressed keys) with File calls,
          // never through the mapping: a file cut short meanwhile is an IOError naming it.
          if (chunks.before_copy && !file)  // rows read through a mapping in memory
            chunks.before_copy(parts.back().data, parts.back().nbytes);
        }
        const auto plan = storage::plan_append(w, batch, current, storage::derived_keys(*store),
                                               {end - at}, theirs);
        storage::apply_append(*store, plan, parts, c);
        at = end;
        if (at < rows) {
          store->commit();
          if (chunks.progress) chunks.progress(at, rows);
        }
      } while (at < rows);
    }
    store->commit();
    if (chunks.progress) chunks.progress(rows, rows);
  } catch (const Error&) {
    store->rollback();  // nothing of this import stays staged; what was committed is untouched
    throw;
  }
  result.total_rows = store->batch_size().empty() ? 0 : store->batch_size()[0];
  result.generation = store->generation();
  return result;
}

}  // namespace tdstore
