// Mapping between libtorch scalar types and tdstore's dtype registry (storage/dtype.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "storage/dtype.h"

namespace tdstore {

std::optional<storage::DType> to_storage_dtype(c10::ScalarType t);
c10::ScalarType to_scalar_type(storage::DType d);

}  // namespace tdstore
