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
  for (const auto& k : plan.stale) drop_derived(store, k);
  store.set_batch_size(plan.grown);
  for (const auto& p : parts) {
    if (plan.creating && compression.enabled()) {
      store.put_compressed(p.key, p.dtype, p.shape, p.data, p.nbytes, compression, p.capacity,
                           p.flags);
      continue;
    }
    if (plan.creating) {
      store.put(p.key, p.dtype, p.shape, p.data, p.nbytes, p.capacity, p.flags);
      continue;
    }
    std::vector<int64_t> shape = p.shape;
    shape[0] += store.find(p.key)->shape[0];  // plan_append: the key is held, shapes agree
    store.append(p.key, shape, p.data, p.nbytes, p.capacity);
  }
}

}  // namespace tdstore::storage
