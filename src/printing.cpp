// The readable printout of a TensorDict: one line per leaf, grouped by nesting level.
#include <ostream>
#include <sstream>

#include "src/dtype_map.h"
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
    at::Tensor t = get(k);
    auto code = to_storage_dtype(t.scalar_type());
    os << "\n"
       << std::string(2 * parts.size(), ' ') << parts.back() << ": "
       << (code ? storage::dtype_name(*code) : std::string_view(c10::toString(t.scalar_type())))
       << " " << shape_string(t.sizes());
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const TensorDict& td) { return os << td.to_string(); }

}  // namespace tdstore
