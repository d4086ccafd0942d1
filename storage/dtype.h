// The dtype registry (include/tdstore/dtype.h) under the storage engine's names.
#pragma once

#include "tdstore/dtype.h"

namespace tdstore::storage {

using tdstore::DType;
using tdstore::dtype_from_name;
using tdstore::dtype_name;
using tdstore::dtype_size;
using tdstore::dtype_valid;

}  // namespace tdstore::storage
