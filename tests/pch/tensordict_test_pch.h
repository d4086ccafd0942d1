// Precompiled for tensordict_test (tests/meson.build: cpp_pch): the headers most of its files
// include, parsed once per build rather than once per file. Each test file still includes what
// it uses.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tdstore/tdstore.h"
