// The readable printout of a TensorDict (one line per leaf, grouped by nesting level), and what
// the error for a missing key lists.
#include <algorithm>
#include <cctype>
#include <ostream>
#include <sstream>

#include "src/dtype_map.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {

std::string TensorDict::to_string() const {
  if (closed()) return "TensorDict(closed, was " + impl_.get()->closed_where + ")";
  std::ostringstream os;
  auto ks = keys();
  os << "TensorDict(batch_size=" << shape_string(batch_size()) << ", keys=" << ks.size();
  if (is_persistent()) os << ", store=" << path().string() << ", generation=" << generation();
  if (!prefix_.empty()) os << ", prefix=" << prefix_;
  os << ")";
  std::vector<std::string> open;  // path components of the group printed last
  for (const auto& k : ks) {
    std::vector<std::string> parts = split_key(k);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common])
      ++common;
    open.resize(common);
    for (size_t d = common; d + 1 < parts.size(); ++d) {
      os << "\n" << std::string(2 * (d + 1), ' ') << parts[d] << "/";
      open.push_back(parts[d]);
    }
    os << "\n" << std::string(2 * parts.size(), ' ') << parts.back() << ": ";
    // A stored dense key's dtype and shape are its entry's: nothing is read (nor decompressed).
    const auto& impl = *impl_;
    const std::string full = full_key(k);
    const auto e = impl.persistent() && !detail::observer_for(&impl) && !impl.lazy.count(full)
                       ? impl.store->find(full)
                       : std::nullopt;
    if (e && !(e->flags & storage::kSlotRagged)) {
      os << storage::dtype_name(e->dtype) << " " << shape_text(e->shape);
      if (e->compressed()) os << " (compressed)";
      continue;
    }
    at::Tensor t = get(k);
    auto code = to_storage_dtype(t.scalar_type());
    os << (code ? storage::dtype_name(*code) : std::string_view(c10::toString(t.scalar_type())))
       << " " << shape_string(t.sizes());
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const TensorDict& td) { return os << td.to_string(); }

namespace {

// Edits (insert, delete, substitute, swap two neighbours; case ignored) turning a into b, counted
// up to limit + 1 (the optimal string alignment distance).
size_t edits(std::string_view a, std::string_view b, size_t limit) {
  if (a.size() > b.size()) std::swap(a, b);
  if (b.size() - a.size() > limit) return limit + 1;
  auto same = [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  };
  std::vector<size_t> before(a.size() + 1), row(a.size() + 1), next(a.size() + 1);
  for (size_t i = 0; i <= a.size(); ++i) row[i] = i;
  for (size_t j = 1; j <= b.size(); ++j) {
    next[0] = j;
    size_t best = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      next[i] =
          std::min({row[i] + 1, next[i - 1] + 1, row[i - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1]))
        next[i] = std::min(next[i], before[i - 2] + 1);
      best = std::min(best, next[i]);
    }
    if (best > limit) return limit + 1;
    before.swap(row);
    row.swap(next);
  }
  return row[a.size()];
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + in_quotes(k);
  return out;
}

}  // namespace

std::string TensorDict::Impl::missing_key(std::string_view full) const {
  constexpr size_t kListedKeys = 8, kCloseKeys = 3;
  const std::vector<std::string> present = keys_under("");
  // Close: a few edits apart (a third of the key's length, at least two, fewer than its
  // length), or the same last path component under another prefix ("x" for "obs/x").
  const size_t limit = std::min(std::max<size_t>(2, full.size() / 3), full.size() - 1);
  const std::string_view leaf = full.substr(full.rfind('/') + 1);
  std::vector<std::pair<size_t, std::string>> close;
  for (const auto& k : present) {
    size_t d = edits(full, k, limit);
    if (d > limit && std::string_view(k).substr(k.rfind('/') + 1) == leaf) d = limit;
    if (d <= limit) close.emplace_back(d, k);
  }
  std::stable_sort(close.begin(), close.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  if (close.size() > kCloseKeys) close.resize(kCloseKeys);
  std::string msg = where(*this) + ": key " + in_quotes(full) + " not found";
  if (!close.empty()) {
    std::vector<std::string> names;
    for (auto& [d, k] : close) names.push_back(std::move(k));
    msg += "; did you mean " + quoted_list(names) + "?";
  }
  if (present.empty()) return msg + " (the dict holds no keys)";
  if (present.size() <= kListedKeys) return msg + " (keys: " + quoted_list(present) + ")";
  return msg + " (" + std::to_string(present.size()) + " keys)";
}

}  // namespace tdstore
