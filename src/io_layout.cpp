#include "src/io_layout.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "src/dtype_map.h"
#include "tdstore/errors.h"

namespace tdstore::detail {

at::Tensor allocate(const storage::ArrayLayout& l, const std::string& file) {
  try {
    return at::empty(l.shape, to_scalar_type(l.dtype));
  } catch (const c10::Error& e) {
    throw Error(file + ": cannot allocate " + std::to_string(l.nbytes) + " bytes for its data: " +
                e.what_without_backtrace());
  }
}

void to_host_order(at::Tensor& t, const storage::ArrayLayout& l) {
  const size_t item = storage::dtype_size(l.dtype);
  if (!l.big_endian || item < 2) return;
  const bool complex = l.dtype == storage::DType::Complex64 || l.dtype == storage::DType::Complex128;
  const size_t unit = complex ? item / 2 : item;
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (uint64_t i = 0; i < l.nbytes; i += unit) std::reverse(p + i, p + i + unit);
}

}  // namespace tdstore::detail
