// Loader: gathering a batch's rows (dense rows by memcpy, ragged rows padded) from the
// columns or from the windows held in memory, and the read-ahead of the quasi-random order.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "src/dataset_impl.h"
#include "src/dtype_map.h"
#include "src/lazy_internal.h"
#include "src/loader_state.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {
namespace detail {

std::optional<storage::Store::FileBytes> arena_bytes(const TensorDict& owner,
                                                     const at::Tensor& part) {
  const storage::Store* store = detail::Access::impl(owner).store.get();
  if (!store) return std::nullopt;
  return store->arena_bytes(part.data_ptr(),
                            static_cast<size_t>(part.numel()) * part.element_size());
}

Column one_part(std::string key, at::Tensor t) {
  return Column{std::move(key), {std::move(t)}, {}, {0}, {}, {}};
}

void add_part(Column& c, const TensorDict& owner, const std::string& key, bool pack, int64_t rows) {
  const TensorDict::Impl& impl = detail::Access::impl(owner);
  const std::string full = detail::Access::prefix(owner) + key;
  // Observed reads (a recording) go through get(), which tells the observer.
  std::shared_ptr<const PackedPart> packed =
      pack && !detail::observer_for(&impl) ? impl.packed(full) : nullptr;
  if (!packed) {
    at::Tensor t = owner.get(key);
    c.parts.push_back(cpu_contiguous(rows < 0 ? t : t.slice(0, 0, rows)));
    c.files.push_back(arena_bytes(owner, c.parts.back()));
    if (!c.packed.empty()) c.packed.push_back(nullptr);
    return;
  }
  std::vector<int64_t> shape = packed->shape;
  if (rows >= 0) shape[0] = rows;  // a dataset shard's published rows: dense keys have dim 0
  c.parts.push_back(
      at::empty(shape, at::TensorOptions().dtype(to_scalar_type(packed->dtype)).device(at::kMeta)));
  c.files.push_back(std::nullopt);
  c.packed.resize(c.parts.size() - 1);
  c.packed.push_back(std::move(packed));
}

at::Tensor unpack(const PackedPart& p, int64_t rows) {
  std::vector<int64_t> shape = p.shape;
  if (!shape.empty()) shape[0] = rows;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(to_scalar_type(p.dtype)));
  // Written whole at once: huge pages spare a page fault per 4 KiB (most of the time on this
  // VM's 2 cores). The stored bytes are asked for at once, so that slow storage is read at its
  // rate rather than a readahead window per page fault.
  detail::advise_huge_pages(t);
  if (rows > 0 && !p.index.blocks.empty()) {
    const auto [a, z] =
        storage::frames_of(p.index, 0, static_cast<uint64_t>(shape.empty() ? 1 : rows));
    Env::posix()->advise(p.object + a, static_cast<size_t>(z - a), Env::Advice::WillNeed);
  }
  storage::read_rows(p.object, p.index, 0, shape.empty() ? 1 : static_cast<uint64_t>(rows),
                     t.data_ptr(), p.where);
  return t;
}

size_t part_of(const Column& c, int64_t row) {
  if (c.starts.size() == 1) return 0;
  return static_cast<size_t>(std::upper_bound(c.starts.begin(), c.starts.end(), row) -
                             c.starts.begin()) -
         1;
}

at::Tensor gather_dense(const Column& c, const at::Tensor& idx, bool pin,
                        detail::BatchBuffers* buffers) {
  const at::Tensor& first = c.parts[0];
  std::vector<int64_t> shape(first.sizes().begin(), first.sizes().end());
  shape[0] = idx.numel();
  at::Tensor out =
      !pin && buffers
          ? buffers->empty(shape, first.scalar_type())
          : at::empty(shape, at::TensorOptions().dtype(first.scalar_type()).pinned_memory(pin));
  const size_t row =
      static_cast<size_t>(out.numel() / std::max<int64_t>(idx.numel(), 1)) * out.element_size();
  auto* to = static_cast<uint8_t*>(out.data_ptr());
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const size_t p = part_of(c, ix[i]);
    const auto* from = static_cast<const uint8_t*>(c.parts[p].data_ptr());
    std::memcpy(to + static_cast<size_t>(i) * row,
                from + static_cast<size_t>(ix[i] - c.starts[p]) * row, row);
  }
  return out;
}

at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& idx, bool pin,
                       detail::BatchBuffers* buffers) {
  return gather_dense(one_part({}, src), idx, pin, buffers);
}

std::pair<at::Tensor, at::Tensor> gather_ragged(const Column& c, const at::Tensor& idx) {
  const int64_t* ix = idx.data_ptr<int64_t>();
  std::vector<size_t> part(static_cast<size_t>(idx.numel()));
  at::Tensor lengths = at::empty({idx.numel()}, at::kLong);
  int64_t* len = lengths.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i < idx.numel(); ++i) {
    part[i] = part_of(c, ix[i]);
    const int64_t* off = c.offsets[part[i]].data_ptr<int64_t>();
    const int64_t r = ix[i] - c.starts[part[i]];
    len[i] = off[r + 1] - off[r];
    longest = std::max(longest, len[i]);
  }
  const at::Tensor& first = c.parts[0];
  std::vector<int64_t> shape{idx.numel(), longest};
  shape.insert(shape.end(), first.sizes().begin() + 1, first.sizes().end());
  at::Tensor padded = at::zeros(shape, first.scalar_type());
  int64_t per_item = 1;
  for (size_t d = 2; d < shape.size(); ++d) per_item *= shape[d];
  const size_t item = static_cast<size_t>(per_item) * padded.element_size();
  auto* dst = static_cast<uint8_t*>(padded.data_ptr());
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const int64_t* off = c.offsets[part[i]].data_ptr<int64_t>();
    const auto* src = static_cast<const uint8_t*>(c.parts[part[i]].data_ptr());
    std::memcpy(dst + static_cast<size_t>(i * longest) * item,
                src + static_cast<size_t>(off[ix[i] - c.starts[part[i]]]) * item,
                static_cast<size_t>(len[i]) * item);
  }
  return {padded, lengths};
}

void read_ahead_rows(const Column& c, const at::Tensor& idx) {
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const size_t p = part_of(c, ix[i]);
    const at::Tensor& part = c.parts[p];
    if (part.size(0) == 0) continue;
    int64_t lo = ix[i] - c.starts[p], hi = lo + 1;
    if (c.ragged()) {  // rows to values
      const int64_t* off = c.offsets[p].data_ptr<int64_t>();
      lo = off[lo], hi = off[hi];
    }
    const int64_t per = part.numel() / part.size(0) * part.element_size();
    Env::posix()->advise(static_cast<const uint8_t*>(part.data_ptr()) + lo * per,
                         static_cast<size_t>((hi - lo) * per), Env::Advice::WillNeed);
  }
}

at::Tensor cpu_contiguous(at::Tensor t) {
  return t.device().is_cpu() && t.is_contiguous() ? t : t.cpu().contiguous();
}

}  // namespace detail

int64_t Loader::State::row_bytes() const {
  int64_t bytes = 0;
  for (const auto& c : columns) {
    int64_t rows = 0, total = 0;
    for (size_t p = 0; p < c.parts.size(); ++p) {
      const at::Tensor& part = c.parts[p];
      const int64_t part_rows = c.ragged() ? c.offsets[p].numel() - 1 : part.size(0);
      const int64_t k = std::clamp<int64_t>(n - c.starts[p], 0, part_rows);  // rows below n
      if (k == 0 || part.size(0) == 0) continue;
      const int64_t unit = part.numel() / part.size(0) * part.element_size();  // per dim-0 entry
      if (c.ragged()) {
        const int64_t* off = c.offsets[p].data_ptr<int64_t>();
        total += (off[k] - off[0]) * unit;
      } else {
        total += k * unit;
      }
      rows += k;
    }
    bytes += rows > 0 ? total / rows : 0;
  }
  return bytes;
}

void Loader::State::advise_block(int64_t block, Env::Advice advice) const {
  const int64_t first = block * plan.block_rows, last = std::min(n, first + plan.block_rows);
  for (const auto& c : columns)
    for (size_t p = 0; p < c.parts.size(); ++p) {
      if (c.packed_at(p)) continue;  // read by the windows
      const at::Tensor& part = c.parts[p];
      const int64_t rows = c.ragged() ? c.offsets[p].numel() - 1 : part.size(0);
      int64_t lo = std::max(first, c.starts[p]) - c.starts[p];
      int64_t hi = std::min(last, c.starts[p] + rows) - c.starts[p];
      if (lo >= hi || part.size(0) == 0) continue;
      if (c.ragged()) {  // rows to values
        const int64_t* off = c.offsets[p].data_ptr<int64_t>();
        lo = off[lo], hi = off[hi];
      }
      const int64_t per = part.numel() / part.size(0) * part.element_size();
      Env::posix()->advise(static_cast<const uint8_t*>(part.data_ptr()) + lo * per,
                           static_cast<size_t>((hi - lo) * per), advice);
    }
}

void Loader::State::advise_columns() const {
  const bool random = order() == LoaderOrder::Random && over_budget();
  for (const auto& c : columns)
    for (size_t i = 0; i < c.parts.size(); ++i) {
      if (c.packed_at(i)) continue;  // read by the windows
      const at::Tensor& p = c.parts[i];
      Env::posix()->advise(p.data_ptr(), static_cast<size_t>(p.numel() * p.element_size()),
                           random ? Env::Advice::Random : Env::Advice::Normal);
    }
}

bool Loader::State::any_packed() const {
  for (const auto& c : columns)
    for (const auto& p : c.packed)
      if (p) return true;
  return false;
}

void Loader::State::unpack_columns() {
  if (!any_packed()) return;  // the same epoch again: what is kept stays
  std::vector<Unpacked> now;
  for (auto& c : columns)
    for (size_t p = 0; p < c.packed.size(); ++p) {
      if (!c.packed[p]) continue;
      const detail::PackedPart& part = *c.packed[p];
      const int64_t rows = c.parts[p].size(0);
      auto same = [&](const Unpacked& u) {
        return part.generation != 0 && u.from->generation == part.generation &&
               u.from->object == part.object &&
               u.from->index.index_offset == part.index.index_offset && u.rows.size(0) == rows &&
               u.rows.scalar_type() == c.parts[p].scalar_type() &&
               u.rows.sizes() == c.parts[p].sizes();
      };
      auto kept = std::find_if(unpacked.begin(), unpacked.end(), same);
      c.parts[p] = kept != unpacked.end() ? kept->rows : detail::unpack(part, rows);
      now.push_back({c.packed[p], c.parts[p]});
      c.packed[p] = nullptr;
    }
  unpacked = std::move(now);  // what this epoch did not read is freed
}

void Loader::State::plan_windows(int64_t from) {
  windowed = false;
  slots = 2;
  // Within the budget, packed columns are read whole once (unpack_columns) and kept for the
  // epochs after.
  if (!over_budget() || columns.empty()) return;
  std::vector<detail::WindowSource> sources;
  for (const auto& c : columns) {
    if (c.ragged()) return;
    detail::WindowSource s;
    const at::Tensor& first = c.parts[0];
    s.row_bytes = first.element_size();
    for (int64_t d = 1; d < first.dim(); ++d) s.row_bytes *= first.size(d);
    for (size_t p = 0; p < c.parts.size(); ++p) {
      const at::Tensor& part = c.parts[p];
      s.parts.push_back(c.packed_at(p) ? nullptr : static_cast<const uint8_t*>(part.data_ptr()));
      s.rows.push_back(part.size(0));
      const bool known = p < c.files.size() && c.files[p];
      s.files.push_back(known ? c.files[p]->file : nullptr);
      s.offsets.push_back(known ? c.files[p]->offset : 0);
    }
    s.starts = c.starts;
    s.packed = c.packed;
    s.release = over_budget();
    sources.push_back(std::move(s));
  }
  for (int64_t b = from, total = batches(); b < total; ++b)
    slots = std::max(slots, last_window_of(b) - window_of(b) + 1);
  window_buffers.plan(n, plan.block_rows, plan.window_blocks, block_order, std::move(sources),
                      slots);
  windowed = true;
  pipeline.filled(window_of(from) - 1);
}

void Loader::State::advise_window(int64_t w, Env::Advice advice) const {
  const auto first = static_cast<size_t>(w * plan.window_blocks);
  const auto last = std::min(block_order.size(), first + static_cast<size_t>(plan.window_blocks));
  for (size_t i = first; i < last; ++i) advise_block(block_order[i], advice);
}

void Loader::State::read_ahead_loop(int64_t from) {
  const auto windows = static_cast<int64_t>(window_starts.size()) - 1;
  const int64_t total = batches();
  // A store's pages are released; memory of an in-memory dict is left alone.
  const bool release = !windowed && over_budget() && (dataset || source.is_persistent());
  int64_t released = window_of(from);  // windows before it are no concern of this run
  // Releases the windows before `until`, which the consumer has left.
  auto release_before = [&](int64_t until) {
    for (; release && released < until; ++released) advise_window(released, Env::Advice::Release);
  };
  for (int64_t w = window_of(from); w < windows; ++w) {
    int64_t at = 0;  // the window of the next batch to be taken
    if (!pipeline.wait_for_consumer([&](int64_t consumed) {
          at = window_of(std::min(consumed, total - 1));
          return w <= at + slots - 1;
        }))
      return;
    if (windowed) {
      try {
        window_buffers.fill(w);
      } catch (...) {  // the batches reading it fail: the consumer sees the error
        pipeline.fail(std::current_exception());
        return;
      }
      pipeline.filled(w);
      continue;
    }
    release_before(at);
    advise_window(w, Env::Advice::WillNeed);  // every block's reads submitted at once
    advise_window(w, Env::Advice::Populate);  // mapped as they arrive: gathers take no fault
  }
  if (windowed) return;
  // The epoch's last windows, once every batch is taken; halted mid-epoch, the next run's
  // windows are unknown.
  if (!pipeline.wait_all_taken()) return;
  release_before(windows);
}

TensorDict Loader::State::gather(int64_t b) {
  int64_t bs = options.batch_size;
  at::Tensor idx = indices.slice(0, b * bs, std::min<int64_t>((b + 1) * bs, indices.numel()));
  std::vector<int64_t> batch_size = source.batch_size();  // a dataset's stand-in has its dims
  batch_size[0] = idx.numel();
  TensorDict batch(batch_size);
  auto& impl = detail::Access::impl(batch);
  // Moved once, as built: a batch for another device is not rebuilt.
  const bool move = options.device && !options.device->is_cpu();
  auto put = [&](std::string k, at::Tensor t) {
    if (move) t = t.to(*options.device, /*non_blocking=*/pin);
    impl.insert_unchecked(std::move(k), std::move(t));
  };
  if (order() == LoaderOrder::Random && over_budget()) {
    // This batch's rows, and those of the batch this thread is likely to gather next, so
    // that a batch of reads is always queued while one is copied.
    const int64_t next = b + std::max(1, options.num_workers);
    at::Tensor ahead =
        next * bs < indices.numel()
            ? indices.slice(0, next * bs, std::min<int64_t>((next + 1) * bs, indices.numel()))
            : at::Tensor();
    for (const auto& c : columns) {
      read_ahead_rows(c, idx);
      if (ahead.defined()) read_ahead_rows(c, ahead);
    }
  }
  if (windowed) {
    const int64_t need = last_window_of(b);
    if (!pipeline.wait_filled(need)) return batch;  // halted: nobody takes this batch
  }
  for (size_t ci = 0; ci < columns.size(); ++ci) {
    const Column& c = columns[ci];
    if (windowed) {
      std::vector<int64_t> shape(c.parts[0].sizes().begin(), c.parts[0].sizes().end());
      shape[0] = idx.numel();
      at::Tensor out =
          pin ? at::empty(shape,
                          at::TensorOptions().dtype(c.parts[0].scalar_type()).pinned_memory(true))
              : buffers.empty(shape, c.parts[0].scalar_type());
      window_buffers.gather(ci, idx.data_ptr<int64_t>(), idx.numel(),
                            static_cast<uint8_t*>(out.data_ptr()));
      put(c.key, out);
    } else if (c.ragged()) {  // padded rows plus their lengths
      auto [padded, lengths] = gather_ragged(c, idx);
      put(c.key, padded);
      put(c.key + kLengthsSuffix, lengths);
    } else {
      put(c.key, gather_dense(c, idx, pin, &buffers));
    }
  }
  if (!features.empty()) compute_features(idx, put);
  return batch;
}

}  // namespace tdstore
