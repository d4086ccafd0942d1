// Umbrella header of tdstore. See README.md for a tour and docs/ for the format.
#pragma once

// Tensor arithmetic operators, which examples and most callers use beside tdstore's API; the
// library itself includes only the narrow headers it needs.
#include <ATen/TensorOperators.h>

#include "tdstore/admin.h"
#include "tdstore/compile.h"
#include "tdstore/dataset.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"
#include "tdstore/io.h"
#include "tdstore/loader.h"
#include "tdstore/options.h"
#include "tdstore/tensordict.h"
#include "tdstore/trust.h"
