// Dataset: shard stores plus a manifest committed in one store commit (docs/FORMAT.md,
// "Datasets"). The manifest is the attribute "dataset" of the store <dir>/manifest.
#include "tdstore/dataset.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/where.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "src/dataset_impl.h"
#include "src/dtype_map.h"
#include "src/tensordict_impl.h"
#include "storage/checksum.h"
#include "storage/durable_dirs.h"
#include "storage/keys.h"
#include "storage/messages.h"
#include "tdstore/errors.h"

namespace tdstore {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using storage::KeySpec;
using storage::kManifestAttr;
using storage::Manifest;
using storage::Specs;

std::string dtype_text(const at::Tensor& t) {
  auto d = to_storage_dtype(t.scalar_type());
  return d ? std::string(dtype_name(*d)) : std::string(c10::toString(t.scalar_type()));
}

Specs specs_of(const TensorDict& td) {
  Specs out;
  for (const auto& k : td.keys()) {
    KeySpec s;
    if (td.is_ragged(k)) {
      at::Tensor v = td.get_ragged(k).values;
      s = {dtype_text(v), std::vector<int64_t>(v.sizes().begin() + 1, v.sizes().end()), true};
    } else {
      at::Tensor v = td.get(k);
      s = {dtype_text(v),
           std::vector<int64_t>(v.sizes().begin() + td.batch_dims(), v.sizes().end()), false};
    }
    out.emplace(k, std::move(s));
  }
  return out;
}

// Shard ids present under <dir>/shards, ascending. A store whose directory name is a number
// but not the shard's canonical name (00001 beside 000001) is refused: which one is the shard
// would be a guess.
std::vector<int64_t> shard_ids(const fs::path& dir) {
  std::vector<int64_t> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir / "shards", ec)) {
    const std::string n = e.path().filename().string();
    if (n.empty() || n.size() > 12 || n.find_first_not_of("0123456789") != std::string::npos)
      continue;
    if (!fs::exists(e.path() / "keys.tdd")) continue;
    const int64_t id = std::stoll(n);
    if (n != storage::shard_dir_name(id))
      throw CorruptionError(dir.string() + ": shard directory " + in_quotes(n) + " is not shard " +
                            std::to_string(id) + "'s name '" + storage::shard_dir_name(id) +
                            "' (shard numbers must name one directory each); rename or remove it");
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The xxh3 a publish seals a key's published rows with (FORMAT.md, "Datasets").
uint64_t published_checksum(const TensorDict& shard, const std::string& key, int64_t rows) {
  storage::Xxh3Stream h;
  auto hash = [&](const at::Tensor& t) {
    at::Tensor c = t.contiguous();
    h.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  };
  if (shard.is_ragged(key)) {
    auto r = shard.get_ragged(key);
    hash(r.values.slice(0, 0, r.offsets[rows].item<int64_t>()));
    hash(r.offsets.slice(0, 0, rows + 1));
  } else {
    hash(shard.get(key).slice(0, 0, rows));
  }
  return h.digest();
}

// The commit a shard store is at: (generation, commit time).
std::pair<uint64_t, uint64_t> commit_of(const TensorDict& shard) {
  const auto info = detail::Access::impl(shard).store->info();
  return {info.generation, info.commit_time_ns};
}

}  // namespace

fs::path Dataset::Impl::shard_dir(int64_t id) const {
  return dir / "shards" / storage::shard_dir_name(id);
}

const TensorDict& Dataset::Impl::reader(int64_t id) const {
  if (unreadable) std::rethrow_exception(unreadable);
  return readers.at(id);
}

void Dataset::Impl::load(bool first) {
  auto text = manifest_store.attr(kManifestAttr);
  if (!text)
    throw FormatError(where() + ": not a dataset (its manifest has no '" + kManifestAttr +
                      "' attribute)");
  storage::Manifest next = storage::parse_manifest(*text, where());
  std::map<int64_t, TensorDict> opened;
  std::vector<int64_t> next_starts;
  std::exception_ptr failed;
  int64_t at = 0;
  for (const auto& [id, rows] : next.shards) {
    next_starts.push_back(at);
    at += rows;
    if (rows == 0) continue;
    try {
      TensorDict shard = TensorDict::open(shard_dir(id));
      check_published(next, id, rows, shard);
      opened.emplace(id, std::move(shard));
    } catch (const Error&) {
      if (!first) throw;
      if (!failed) failed = std::current_exception();
    }
  }
  // This handle moves to the new manifest as a whole.
  manifest = std::move(next);
  readers = std::move(opened);
  starts = std::move(next_starts);
  unreadable = failed;
}

void Dataset::Impl::check_published(const storage::Manifest& m, int64_t id, int64_t rows,
                                    const TensorDict& shard) const {
  const std::string name = "shard " + std::to_string(id) + " (" + shard_dir(id).string() + ")";
  const int64_t held = shard.batch_size().empty() ? 0 : shard.batch_size()[0];
  if (held < rows)
    throw CorruptionError(where() + ": " + name + " holds " + std::to_string(held) + " rows; " +
                          std::to_string(rows) + " were published");
  const Specs specs = specs_of(shard);
  for (const auto& [k, spec] : m.keys) {
    auto it = specs.find(k);
    if (it == specs.end() || !(it->second == spec))
      throw CorruptionError(where() + ": " + name + ": key " + in_quotes(k) + " is " +
                            (it == specs.end() ? std::string("absent") : it->second.text()) +
                            "; the manifest published it as " + spec.text());
  }
  auto seal = m.seals.find(id);
  if (seal == m.seals.end()) return;  // format 1: published before shards were sealed
  const auto [generation, committed_at] = commit_of(shard);
  if (generation == seal->second.generation && committed_at == seal->second.committed_at_ns)
    return;  // the commit the publish sealed
  const auto checked = std::make_tuple(seal->second.generation, seal->second.committed_at_ns,
                                       generation, committed_at);
  if (auto it = verified.find(id); it != verified.end() && it->second == checked) return;
  // Committed since the publish (appended, compacted, or rewritten): the published rows must
  // be the bytes the publish sealed.
  for (const auto& [k, sum] : seal->second.checksums)
    if (published_checksum(shard, k, rows) != sum)
      throw CorruptionError(where() + ": " + name + ": key " + in_quotes(k) + ": its " +
                            std::to_string(rows) + " published rows changed after the publish " +
                            "(published at generation " + std::to_string(seal->second.generation) +
                            ", now at " + std::to_string(generation) +
                            "); publish again, or restore the shard");
  verified[id] = checked;
}

std::optional<uint64_t> Dataset::Impl::fingerprint(const std::string& key) const {
  if (!manifest.keys.count(key)) return std::nullopt;
  storage::Xxh3Stream h;
  bool any = false;
  for (const auto& [id, rows] : manifest.shards) {
    if (rows == 0) continue;
    auto fp = storage::key_fingerprint(*detail::Access::impl(reader(id)).store, key);
    if (!fp)
      throw CorruptionError(where() + ": shard " + std::to_string(id) + " has no key '" + key +
                            "', which the manifest lists");
    const uint64_t fields[] = {static_cast<uint64_t>(id), static_cast<uint64_t>(rows), *fp};
    h.update(fields, sizeof fields);
    any = true;
  }
  if (!any) return std::nullopt;
  return h.digest();
}

storage::RowFeatureRecord Dataset::Impl::feature_record(const std::string& feature,
                                                        const std::vector<std::string>& deps_in,
                                                        const std::string& version) const {
  storage::check_key(feature, where());
  std::vector<std::string> deps = deps_in;
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  storage::RowFeatureRecord r;
  r.version = version;
  for (const auto& d : deps) {
    const std::string what =
        where() + ": row feature " + in_quotes(feature) + ": dependency " + in_quotes(d);
    if (d == feature)
      throw KeyError(where() + ": row feature " + in_quotes(feature) + " cannot depend on itself");
    auto spec = manifest.keys.find(d);
    if (spec != manifest.keys.end() && spec->second.ragged)
      throw DTypeError(what + " is ragged; row features over a Dataset read dense keys");
    auto fp = fingerprint(d);
    if (!fp) throw KeyError(what + " is not a key of the published rows");
    r.deps.emplace_back(d, *fp);
  }
  return r;
}

std::optional<TensorDict> Dataset::Impl::open_features() const {
  if (!fs::exists(dir / "features" / "keys.tdd")) return std::nullopt;
  return TensorDict::open(dir / "features");
}

TensorDict Dataset::Impl::features_for_writing(int64_t lock_timeout_ms) const {
  const fs::path p = dir / "features";
  if (!fs::exists(p / "keys.tdd")) {
    // A store is built aside and renamed in (Store::create), so of concurrent first users one
    // creates it and the others find it; threads of one process share the aside name: serialized.
    static std::mutex creating;
    std::lock_guard lock(creating);
    try {
      if (!fs::exists(p / "keys.tdd")) TensorDict::create(p, {});
    } catch (const Error&) {
      if (!fs::exists(p / "keys.tdd")) throw;
    }
  }
  StoreOptions o;
  o.lock_timeout_ms = lock_timeout_ms;
  return TensorDict::open(p, OpenMode::ReadWrite, o);
}

Dataset::Dataset(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Dataset Dataset::create(const fs::path& dir, std::vector<int64_t> row_shape_hint) {
  if (fs::exists(dir / "manifest" / "keys.tdd")) {
    Dataset d = open(dir);
    if (d.impl_->manifest.row_shape != row_shape_hint)
      throw ShapeError(dir.string() + ": dataset rows have batch dims [" +
                       fmt::format("{}", fmt::join(d.impl_->manifest.row_shape, ", ")) +
                       "] after the row dim, not [" +
                       fmt::format("{}", fmt::join(row_shape_hint, ", ")) + "]");
    return d;
  }
  // A dataset appears when its manifest store, complete with its first manifest, is renamed
  // into place: a create that crashed left at most an empty shards/ and manifest.new, which a
  // new create replaces.
  std::error_code ec;
  const fs::path building = dir / "manifest.new";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename();
    if (!(name == "manifest.new" || (name == "shards" && fs::is_empty(e.path(), ec))))
      throw IOError(dir.string() +
                    ": cannot create a dataset: the directory exists and is not a dataset");
  }
  fs::remove_all(building, ec);
  auto env = Env::posix();
  storage::create_directories_durably(*env, dir / "shards");
  {
    TensorDict m = TensorDict::create(building, {});
    Manifest empty;
    empty.row_shape = row_shape_hint;
    m.set_attr(kManifestAttr, storage::manifest_json(empty));
    m.commit();
  }
  env->rename(building, dir / "manifest");
  env->sync_dir(dir);
  return open(dir);
}

Dataset Dataset::open(const fs::path& dir) {
  if (!fs::exists(dir / "manifest" / "keys.tdd"))
    throw FormatError(dir.string() + ": not a dataset (no manifest store at " +
                      (dir / "manifest").string() + ")");
  auto impl = std::make_shared<Impl>();
  impl->dir = dir;
  impl->manifest_store = TensorDict::open(dir / "manifest");
  impl->load(/*first=*/true);
  return Dataset(std::move(impl));
}

const fs::path& Dataset::path() const { return impl_->dir; }

TensorDict Dataset::shard(int64_t shard, StoreOptions options) {
  if (shard < 0)
    throw ArgumentError(impl_->where() + ": shard " + std::to_string(shard) +
                        ": shard numbers start at 0");
  fs::path p = impl_->shard_dir(shard);
  if (fs::exists(p / "keys.tdd")) return TensorDict::open(p, OpenMode::ReadWrite, options);
  std::vector<int64_t> batch{0};
  batch.insert(batch.end(), impl_->manifest.row_shape.begin(), impl_->manifest.row_shape.end());
  return TensorDict::create(p, batch, options);
}

void Dataset::publish() {
  Impl& d = *impl_;
  TensorDict m =
      TensorDict::open(d.dir / "manifest", OpenMode::ReadWrite);  // one publisher at a time
  auto text = m.attr(kManifestAttr);
  if (!text)
    throw FormatError(d.where() + ": not a dataset (its manifest has no '" + kManifestAttr +
                      "' attribute)");
  const Manifest before = storage::parse_manifest(*text, d.where());
  std::map<int64_t, int64_t> published(before.shards.begin(), before.shards.end());
  Manifest next;
  next.row_shape = before.row_shape;
  next.keys = before.keys;
  int64_t reference_shard = before.keys.empty() ? -1 : -2;  // -2: the manifest's own keys
  std::map<int64_t, TensorDict> opened;  // the new manifest's shards with rows, checked
  const std::vector<int64_t> ids = shard_ids(d.dir);
  for (const auto& [id, rows] : before.shards)  // published rows never decrease
    if (rows > 0 && !std::binary_search(ids.begin(), ids.end(), id))
      throw CorruptionError(d.where() + ": shard " + std::to_string(id) + " (" +
                            d.shard_dir(id).string() + ") is gone; " + std::to_string(rows) +
                            " of its rows were published, and published rows never decrease");
  for (int64_t id : ids) {
    TensorDict s = TensorDict::open(d.shard_dir(id));
    const std::string name = "shard " + std::to_string(id) + " (" + d.shard_dir(id).string() + ")";
    const int64_t rows = s.batch_size().empty() ? 0 : s.batch_size()[0];
    if (s.batch_dims() != 1 + static_cast<int64_t>(next.row_shape.size()))
      throw ShapeError(d.where() + ": " + name + " has batch size [" +
                       fmt::format("{}", fmt::join(s.batch_size(), ", ")) +
                       "]; the dataset's rows have " + std::to_string(next.row_shape.size()) +
                       " batch dims after the row dim");
    if (auto it = published.find(id); it != published.end() && rows < it->second)
      throw CorruptionError(d.where() + ": " + name + " holds " + std::to_string(rows) + " rows; " +
                            std::to_string(it->second) + " were published");
    Specs specs = specs_of(s);
    if (!specs.empty() || rows > 0) {
      if (reference_shard == -1) {
        next.keys = specs;
        reference_shard = id;
      }
      const std::string ref =
          reference_shard == -2 ? "the published rows" : "shard " + std::to_string(reference_shard);
      for (const auto& [k, spec] : next.keys) {
        auto it = specs.find(k);
        if (it == specs.end())
          throw KeyError(d.where() + ": " + name + " has no key " + in_quotes(k) + ", which " +
                         ref + " has");
        if (it->second.dtype != spec.dtype)
          throw DTypeError(d.where() + ": " + name + ": key " + in_quotes(k) + " is " +
                           it->second.text() + ", " + ref + " has " + spec.text());
        if (!(it->second == spec))
          throw ShapeError(d.where() + ": " + name + ": key " + in_quotes(k) + " is " +
                           it->second.text() + ", " + ref + " has " + spec.text());
      }
      for (const auto& [k, spec] : specs)
        if (!next.keys.count(k))
          throw KeyError(d.where() + ": " + name + " has key " + in_quotes(k) + ", which " + ref +
                         " lacks");
    }
    next.shards.emplace_back(id, rows);
    if (rows == 0) continue;
    // The seal: the shard's commit now and the checksum of each key's published rows (reused
    // from the previous publish when the shard is still at the commit it sealed).
    storage::ShardSeal seal;
    std::tie(seal.generation, seal.committed_at_ns) = commit_of(s);
    auto old = before.seals.find(id);
    if (old != before.seals.end() && old->second.generation == seal.generation &&
        old->second.committed_at_ns == seal.committed_at_ns && published[id] == rows) {
      seal = old->second;
    } else {
      for (const auto& [k, spec] : next.keys) seal.checksums[k] = published_checksum(s, k, rows);
    }
    next.seals.emplace(id, std::move(seal));
    opened.emplace(id, std::move(s));
  }
  m.set_attr(kManifestAttr, storage::manifest_json(next));
  m.commit();
  // Published: this handle moves to the new manifest with the shards checked above; nothing
  // below can fail, so publish either publishes and returns, or throws having published nothing.
  // (manifest_store catches up at the next refresh().)
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const auto& [id, rows] : next.shards) starts.push_back(std::exchange(at, at + rows));
  d.manifest = std::move(next);
  d.readers = std::move(opened);
  d.starts = std::move(starts);
  d.unreadable = nullptr;
}

int64_t Dataset::rows() const {
  int64_t n = 0;
  for (const auto& [id, rows] : impl_->manifest.shards) n += rows;
  return n;
}

std::vector<int64_t> Dataset::shard_rows() const {
  std::vector<int64_t> out;
  for (const auto& [id, rows] : impl_->manifest.shards) out.push_back(rows);
  return out;
}

std::vector<std::string> Dataset::keys() const {
  std::vector<std::string> out;
  if (rows() == 0) return out;
  for (const auto& [k, s] : impl_->manifest.keys) out.push_back(k);
  return out;
}

TensorDict Dataset::index(const at::Tensor& rows_in) const {
  const Impl& d = *impl_;
  const int64_t total = this->rows();
  // As TensorDict::index: a bool mask over the rows selects, integers are rows (negative ones
  // from the end), anything else is refused.
  if (rows_in.dim() != 1)
    throw ShapeError(d.where() + ": index takes a 1-d tensor of global rows or a mask, not " +
                     std::to_string(rows_in.dim()) + "-d");
  at::Tensor rows;
  if (rows_in.scalar_type() == at::kBool) {
    if (rows_in.size(0) != total)
      throw ShapeError(d.where() + ": mask of " + std::to_string(rows_in.size(0)) +
                       " rows does not match the " + std::to_string(total) + " rows published");
    rows = rows_in.nonzero().reshape({-1});
  } else if (at::isIntegralType(rows_in.scalar_type(), false)) {
    rows = rows_in.to(at::kLong);
    rows = at::where(rows < 0, rows + total, rows);
  } else {
    throw ShapeError(d.where() + ": index tensors must be integral or bool, got " +
                     std::string(c10::toString(rows_in.scalar_type())));
  }
  rows = rows.contiguous();
  const int64_t* r = rows.data_ptr<int64_t>();
  const size_t nshards = d.manifest.shards.size();
  std::vector<std::vector<int64_t>> local(nshards), positions(nshards);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    if (r[i] < 0 || r[i] >= total)
      throw IndexError(d.where() + ": row " + std::to_string(r[i]) +
                       " out of range: " + std::to_string(total) + " rows published");
    size_t s = static_cast<size_t>(std::upper_bound(d.starts.begin(), d.starts.end(), r[i]) -
                                   d.starts.begin()) -
               1;
    while (d.manifest.shards[s].second == 0) --s;  // empty shards share their start with the next
    local[s].push_back(r[i] - d.starts[s]);
    positions[s].push_back(i);
  }
  std::vector<TensorDict> parts;
  std::vector<int64_t> order;
  for (size_t s = 0; s < nshards; ++s) {
    if (local[s].empty()) continue;
    at::Tensor idx =
        at::from_blob(local[s].data(), {static_cast<int64_t>(local[s].size())}, at::kLong).clone();
    parts.push_back(d.reader(d.manifest.shards[s].first).index(idx));
    order.insert(order.end(), positions[s].begin(), positions[s].end());
  }
  if (parts.empty()) {  // no rows asked: the keys with 0 rows (none before any row is published)
    for (const auto& [id, n] : d.manifest.shards)
      if (n > 0) return d.reader(id).index(at::empty({0}, at::kLong));
    std::vector<int64_t> batch{0};
    batch.insert(batch.end(), d.manifest.row_shape.begin(), d.manifest.row_shape.end());
    return TensorDict(batch);
  }
  TensorDict joined = parts.size() == 1 ? parts[0] : TensorDict::cat(parts, 0);
  // joined row j is requested position order[j]: put each back where it was asked for.
  at::Tensor where = at::from_blob(order.data(), {static_cast<int64_t>(order.size())}, at::kLong);
  bool in_order = std::is_sorted(order.begin(), order.end());
  return in_order ? joined : joined.index(at::argsort(where));
}

void Dataset::refresh() {
  impl_->manifest_store.refresh();
  impl_->load(/*first=*/false);
}

void cache_in_parallel(
    Dataset& dataset, int64_t rank, int64_t world_size, const std::function<void()>& barrier,
    const std::function<void(TensorDict& shard, int64_t rank, int64_t world_size)>& job) {
  {
    TensorDict shard = dataset.shard(rank);  // this rank's writer lock, released before the barrier
    job(shard, rank, world_size);
    shard.commit();
  }
  barrier();
  if (rank == 0) dataset.publish();
  barrier();
  dataset.refresh();
}

}  // namespace tdstore
