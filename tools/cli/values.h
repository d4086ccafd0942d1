// Elements of a stored array (C order, host byte order) as numbers, for every dtype tdstore
// stores: float16 and bfloat16 widened exactly, complex as (real, imaginary).
#pragma once

#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include "tdstore/formats.h"

namespace tdstore::cli {

bool is_floating(DType d);  // float16, bfloat16, float32, float64
bool is_complex(DType d);
bool is_integral(DType d);  // bool excluded

// Element i (flat index) of a.
double value_at(const Array& a, uint64_t i);     // complex: the real part
int64_t integer_at(const Array& a, uint64_t i);  // integral and bool dtypes
std::complex<double> complex_at(const Array& a, uint64_t i);

// Rows [begin, end) of dim 0: a view sharing a's bytes. REQUIRES: a has at least one dim.
Array slice_rows(const Array& a, int64_t begin, int64_t end);

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace tdstore::cli
