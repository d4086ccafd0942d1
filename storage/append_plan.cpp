#include "storage/append_plan.h"

#include <algorithm>
#include <iterator>

#include "storage/derived.h"
#include "storage/messages.h"
#include "storage/store.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

AppendPlan plan_append(const std::string& where, const std::vector<int64_t>& batch,
                       const std::map<std::string, ColumnSpec>& current,
                       const std::vector<std::string>& derived,
                       const std::vector<int64_t>& rows_batch,
                       const std::map<std::string, ColumnSpec>& rows) {
  if (batch.empty() || rows_batch.size() != batch.size() ||
      !std::equal(batch.begin() + 1, batch.end(), rows_batch.begin() + 1))
    throw ShapeError(where + ": cannot append rows of batch size " + shape_text(rows_batch) +
                     " to batch size " + shape_text(batch) +
                     " (same rank, equal dims after the first, at least one batch dim)");
  AppendPlan plan;
  plan.creating = current.empty() && batch[0] == 0;
  plan.grown = batch;
  plan.grown[0] += rows_batch[0];
  if (plan.creating) return plan;

  // Derived keys the rows do not bring are dropped: every dependency grows, so none of them
  // would stay valid.
  for (const auto& k : derived)
    if (!rows.count(k)) plan.stale.push_back(k);
  std::vector<std::string> missing, extra;
  for (const auto& [k, spec] : current)
    if (!rows.count(k) && !std::binary_search(plan.stale.begin(), plan.stale.end(), k))
      missing.push_back(k);
  for (const auto& [k, spec] : rows)
    if (!current.count(k)) extra.push_back(k);
  if (!missing.empty() || !extra.empty())
    throw KeyError(where + ": appended rows must hold the same keys: " +
                   (missing.empty() ? "" : "missing " + in_quotes(missing.front())) +
                   (missing.empty() || extra.empty() ? "" : ", ") +
                   (extra.empty() ? "" : "unexpected " + in_quotes(extra.front())));

  for (const auto& [k, theirs] : rows) {
    const ColumnSpec& mine = current.at(k);
    const std::string key = where + ": key " + in_quotes(k);
    if (mine.ragged != theirs.ragged) throw ShapeError(key + " is ragged on one side only");
    if (mine.dtype != theirs.dtype)
      throw DTypeError(key + ": appending " + (theirs.ragged ? "ragged " : "") +
                       std::string(dtype_name(theirs.dtype)) + " rows to " +
                       std::string(dtype_name(mine.dtype)));
    if (mine.shape.size() != theirs.shape.size() || mine.shape.empty() ||
        !std::equal(mine.shape.begin() + 1, mine.shape.end(), theirs.shape.begin() + 1))
      throw ShapeError(key + ": " + (theirs.ragged ? "ragged values" : "rows") + " of shape " +
                       shape_text(theirs.shape) + " do not extend shape " + shape_text(mine.shape));
  }
  return plan;
}

void apply_append(Store& store, const AppendPlan& plan, const std::vector<AppendPart>& parts,
                  const Compression& compression) {
  // Each dense key ends with plan.grown[0] rows, or the commit would publish a batch size its
  // keys do not start with (a plan made from another batch size than the store's): refused
  // before anything is staged.
  std::vector<std::vector<int64_t>> shapes;  // each part's shape after the append
  for (const auto& p : parts) {
    std::vector<int64_t> shape = p.shape;
    if (!plan.creating) {
      const auto held = store.find(p.key);
      if (!held)
        throw KeyError(store.path().string() + ": cannot append to key " + in_quotes(p.key) +
                       ": not found");
      if (!shape.empty()) shape[0] += held->shape.empty() ? 0 : held->shape[0];
    }
    if (!(p.flags & kSlotRagged) && (shape.empty() || shape[0] != plan.grown.at(0)))
      throw ShapeError(store.path().string() + ": key " + in_quotes(p.key) + ": its rows after " +
                       "the append, " + shape_text(shape) + ", do not start with the planned " +
                       "batch size " + shape_text(plan.grown) + " (an append is planned from " +
                       "the store's batch size, " + shape_text(store.batch_size()) + ")");
    shapes.push_back(std::move(shape));
  }
  for (const auto& k : plan.stale) drop_derived(store, k);
  store.set_batch_size(plan.grown);
  for (size_t i = 0; i < parts.size(); ++i) {
    const AppendPart& p = parts[i];
    const Payload bytes{p.data, p.nbytes, p.file, p.file_offset};
    if (plan.creating && compression.enabled()) {
      store.put_compressed(p.key, p.dtype, p.shape, bytes, compression, p.capacity, p.flags);
      continue;
    }
    if (plan.creating) {
      store.put(p.key, p.dtype, p.shape, bytes, p.capacity, p.flags);
      continue;
    }
    store.append(p.key, shapes[i], bytes, p.capacity);
  }
}

}  // namespace tdstore::storage
