// Tensors for the array layouts storage/formats.h parses. Internal to src/.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "storage/formats.h"

namespace tdstore::detail {

// An uninitialized tensor of l's dtype and shape; tdstore::Error (not c10::Error) when it
// cannot be allocated.
at::Tensor allocate(const storage::ArrayLayout& l, const std::string& file);
// Byte-swaps big-endian elements in place (each half of a complex element separately).
void to_host_order(at::Tensor& t, const storage::ArrayLayout& l);

}  // namespace tdstore::detail
