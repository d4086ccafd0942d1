// Loader: row-wise lazy features, computed for the rows of each batch the first time an epoch
// visits them and stored with their provenance at the end of every epoch.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "src/dataset_impl.h"
#include "src/lazy_internal.h"
#include "src/loader_state.h"
#include "src/tensordict_impl.h"

namespace tdstore {

void Loader::State::compute_features(const at::Tensor& idx,
                                     const std::function<void(std::string, at::Tensor)>& put) {
  for (auto& fp : features) {
    Feature& f = *fp;
    if (f.stored) continue;  // loaded as a key
    std::vector<int64_t> todo;
    {
      storage::MutexLock lock(&f.mu);
      const int64_t* ix = idx.data_ptr<int64_t>();
      const uint8_t* done = f.done.data_ptr<uint8_t>();
      for (int64_t i = 0; i < idx.numel(); ++i)
        if (!done[ix[i]]) todo.push_back(ix[i]);
    }
    if (!todo.empty()) {
      at::Tensor rows = at::empty({static_cast<int64_t>(todo.size())}, at::kLong);
      std::memcpy(rows.data_ptr(), todo.data(), todo.size() * sizeof(int64_t));
      std::vector<int64_t> bsz = source.batch_size();
      bsz[0] = rows.numel();
      TensorDict deps(bsz);
      for (const auto& d : f.deps) deps.set(d.key, gather_dense(d, rows, false, &buffers));
      at::Tensor value = f.spec.fn(deps).detach().cpu().contiguous();
      if (value.dim() == 0 || value.size(0) != rows.numel())
        throw ShapeError(fmt::format("row feature '{}': fn returned shape [{}] for {} rows",
                                     f.spec.key, fmt::join(value.sizes(), ", "), rows.numel()));
      storage::MutexLock lock(&f.mu);
      if (!f.values.defined()) {
        std::vector<int64_t> shape(value.sizes().begin(), value.sizes().end());
        shape[0] = source_rows;
        f.values = at::zeros(shape, value.scalar_type());
      }
      f.values.index_copy_(0, rows, value.to(f.values.scalar_type()));
      uint8_t* done = f.done.data_ptr<uint8_t>();
      for (int64_t r : todo) done[r] = 1;
      f.done_rows += static_cast<int64_t>(todo.size());
      f.dirty = true;
    }
    storage::MutexLock lock(&f.mu);
    put(f.spec.key, gather_rows(f.values, idx, pin, &buffers));
  }
}

bool Loader::State::stored_valid(const RowFeature& spec) const {
  const auto& impl = detail::Access::impl(source);
  return source.contains(spec.key) &&
         detail::lazy_valid(impl, detail::lazy_request(impl, spec.key, spec.deps, spec.version));
}

storage::RowFeatureRecord Loader::State::provenance(const RowFeature& spec) const {
  if (dataset)
    return detail::DatasetAccess::impl(*dataset).feature_record(spec.key, spec.deps, spec.version);
  auto request =
      detail::lazy_request(detail::Access::impl(source), spec.key, spec.deps, spec.version);
  return {request.deps, request.version};
}

void Loader::State::drop_feature_keys() {
  std::erase_if(keys, [&](const std::string& k) {
    for (const auto& f : features)
      if (k == f->spec.key || k == f->spec.key + std::string(detail::kRowsDoneSuffix)) return true;
    return false;
  });
}

std::unique_ptr<Loader::State::Feature> Loader::State::make_feature(RowFeature spec,
                                                                    bool* complete) {
  auto& impl = detail::Access::impl(source);
  auto f = std::make_unique<Feature>();
  storage::MutexLock lock(&f->mu);  // no other thread has it yet
  f->spec = std::move(spec);
  f->done = at::zeros({source_rows}, at::kByte);
  auto request = detail::lazy_request(impl, f->spec.key, f->spec.deps, f->spec.version);
  f->record = {request.deps, request.version};
  f->rows = source_rows;
  const std::string mask_key = f->spec.key + std::string(detail::kRowsDoneSuffix);
  const std::string attr = std::string(detail::kRowFeatureAttr) + f->spec.key;
  std::erase_if(keys, [&](const std::string& k) { return k == f->spec.key || k == mask_key; });
  *complete = source.contains(f->spec.key) && detail::lazy_valid(impl, request);
  if (*complete) {
    f->stored = true;
    f->done_rows = source_rows;
    keys.push_back(f->spec.key);
  } else if (auto saved = source.attr(attr);
             saved && source.contains(mask_key) && source.contains(f->spec.key)) {
    // Partial progress of an earlier run, usable when its deps and version still match.
    const storage::RowFeatureRecord r =
        storage::parse_row_feature_record(*saved, where() + ": attribute " + in_quotes(attr));
    if (r.deps == request.deps && r.version == request.version &&
        source.get(mask_key).size(0) == source_rows) {
      f->values = source.get(f->spec.key).clone();
      f->done = source.get(mask_key).clone();
      f->done_rows = f->done.sum().item<int64_t>();
    }
  }
  return f;
}

// A dataset's feature lives in its features store (Dataset::Impl::open_features) as plain
// tensors over the global rows: values, done-rows mask, provenance attribute.
std::unique_ptr<Loader::State::Feature> Loader::State::make_dataset_feature(RowFeature spec,
                                                                            bool* complete) {
  const Dataset::Impl& d = detail::DatasetAccess::impl(*dataset);
  auto f = std::make_unique<Feature>();
  storage::MutexLock lock(&f->mu);  // no other thread has it yet
  f->spec = std::move(spec);
  f->record = d.feature_record(f->spec.key, f->spec.deps, f->spec.version);
  f->rows = source_rows;
  f->done = at::zeros({source_rows}, at::kByte);
  *complete = false;
  if (feature_store)
    feature_store->refresh();
  else
    feature_store = d.open_features();
  if (!feature_store) return f;
  const std::string mask_key = f->spec.key + std::string(detail::kRowsDoneSuffix);
  const std::string attr = std::string(detail::kRowFeatureAttr) + f->spec.key;
  auto saved = feature_store->attr(attr);
  if (!saved || !feature_store->contains(f->spec.key) || !feature_store->contains(mask_key))
    return f;
  const std::string w = (d.dir / "features").string() + ": attribute " + in_quotes(attr);
  const storage::RowFeatureRecord r = storage::parse_row_feature_record(*saved, w);
  at::Tensor values = feature_store->get(f->spec.key), done = feature_store->get(mask_key);
  if (r.deps != f->record.deps || r.version != f->record.version ||
      done.scalar_type() != at::kByte || done.dim() != 1 || done.size(0) != source_rows ||
      values.dim() == 0 || values.size(0) != source_rows)
    return f;  // stale: computed from other rows or inputs
  f->done_rows = done.sum().item<int64_t>();
  if (f->done_rows == source_rows) {
    f->stored = *complete = true;
    f->values = cpu_contiguous(values);  // read zero-copy like a key
  } else {
    f->values = values.clone();
    f->done = done.clone();
  }
  return f;
}

// Merges each feature's new rows into the features store: rows another loader (another rank)
// stored under the same provenance join this loader's, so ranks that compute disjoint rows
// complete the feature together.
void Loader::State::flush_dataset_features() {
  bool any = false;
  for (auto& f : features) {
    storage::MutexLock lock(&f->mu);
    any = any || f->dirty;
  }
  if (!any) return;
  const Dataset::Impl& d = detail::DatasetAccess::impl(*dataset);
  TensorDict store = d.features_for_writing(kFeatureLockWaitMs);
  for (auto& fp : features) {
    Feature& f = *fp;
    storage::MutexLock lock(&f.mu);
    if (!f.dirty) continue;
    const std::string mask_key = f.spec.key + std::string(detail::kRowsDoneSuffix);
    const std::string attr = std::string(detail::kRowFeatureAttr) + f.spec.key;
    if (auto saved = store.attr(attr);
        saved && store.contains(f.spec.key) && store.contains(mask_key)) {
      const storage::RowFeatureRecord r = storage::parse_row_feature_record(
          *saved, (d.dir / "features").string() + ": attribute " + in_quotes(attr));
      at::Tensor values = store.get(f.spec.key), done = store.get(mask_key);
      if (r.deps == f.record.deps && r.version == f.record.version &&
          done.scalar_type() == at::kByte && done.sizes() == f.done.sizes() &&
          values.sizes() == f.values.sizes() && values.scalar_type() == f.values.scalar_type()) {
        at::Tensor theirs_done = done.contiguous();
        const uint8_t* theirs = theirs_done.data_ptr<uint8_t>();
        uint8_t* mine = f.done.data_ptr<uint8_t>();
        std::vector<int64_t> join;
        for (int64_t r = 0; r < f.done.numel(); ++r)
          if (theirs[r] && !mine[r]) join.push_back(r);
        if (!join.empty()) {
          at::Tensor rows = at::empty({static_cast<int64_t>(join.size())}, at::kLong);
          std::memcpy(rows.data_ptr(), join.data(), join.size() * sizeof(int64_t));
          f.values.index_copy_(0, rows, gather_rows(cpu_contiguous(values), rows, false, nullptr));
          for (int64_t r : join) mine[r] = 1;
          f.done_rows += static_cast<int64_t>(join.size());
        }
      }
    }
    store.set(f.spec.key, f.values);
    store.set(mask_key, f.done);
    store.set_attr(attr, storage::row_feature_record_json(f.record));
    f.dirty = false;
  }
  store.commit();
  for (auto& f : features) {
    storage::MutexLock lock(&f->mu);
    if (!f->stored && f->done_rows == source_rows && f->values.defined()) {
      f->stored = true;  // read like a key from now on
      keys.push_back(f->spec.key);
      columns.push_back(one_part(f->spec.key, f->values));
    }
  }
}

bool Loader::add_feature(RowFeature spec) {
  State& s = *state_;
  if (s.iterating)
    throw ArgumentError(
        s.where() + ": Loader::add_feature for " + in_quotes(spec.key) + " during an epoch (" +
        std::to_string(s.step) + " of " + std::to_string(s.batches()) +
        " batches handed out): add features before iterating or after an epoch ends");
  if (!detail::Access::prefix(s.source).empty())
    throw ArgumentError(
        s.where() + ": Loader::add_feature for '" + spec.key + "' on a Loader over a sub-dict ('" +
        detail::Access::prefix(s.source) +
        "'): features are stored by full name; add them on a Loader over the whole dict");
  s.halt();  // the workers of an epoch that ended have exited; none reads the keys below
  bool complete = false;
  s.features.push_back(s.dataset ? s.make_dataset_feature(std::move(spec), &complete)
                                 : s.make_feature(std::move(spec), &complete));
  s.take_keys();  // a stored feature is read like a key, a computed one reads its deps
  return complete;
}

int64_t Loader::feature_rows_done(const std::string& key) const {
  for (const auto& f : state_->features)
    if (f->spec.key == key) {
      storage::MutexLock lock(&f->mu);
      return f->done_rows;
    }
  throw KeyError("Loader: no row feature " + in_quotes(key));
}

void Loader::flush_features() {
  State& s = *state_;
  if (s.features.empty()) return;  // nothing to store: the source (maybe closed) is not touched
  if (s.options.serialize_writes) return s.options.serialize_writes([&] { store_features(); });
  store_features();
}

void Loader::store_features() {
  State& s = *state_;
  if (s.dataset) return s.flush_dataset_features();
  if (!s.source.is_persistent() || !s.source.is_writable()) return;
  auto& impl = detail::Access::impl(s.source);
  bool wrote = false;
  for (auto& fp : s.features) {
    State::Feature& f = *fp;
    storage::MutexLock lock(&f.mu);
    if (f.stored || !f.values.defined()) continue;
    const std::string mask_key = f.spec.key + std::string(detail::kRowsDoneSuffix);
    const std::string attr = std::string(detail::kRowFeatureAttr) + f.spec.key;
    auto request = detail::lazy_request(impl, f.spec.key, f.spec.deps, f.spec.version);
    if (f.done_rows == s.source_rows) {  // complete: a lazy property with provenance
      if (s.source.contains(mask_key)) s.source.erase(mask_key);
      s.source.erase_attr(attr);
      detail::lazy_store(s.source, request, f.values);
      f.stored = true;
      s.keys.push_back(f.spec.key);  // read like a key from now on
      s.columns.push_back(one_part(f.spec.key, cpu_contiguous(s.source.get(f.spec.key))));
    } else {
      s.source.set(f.spec.key, f.values);
      s.source.set(mask_key, f.done);
      s.source.set_attr(attr, storage::row_feature_record_json({request.deps, request.version}));
      wrote = true;
    }
  }
  if (wrote) s.source.commit();
}

}  // namespace tdstore
