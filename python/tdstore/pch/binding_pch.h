// Precompiled for the extension's files (python/tdstore/meson.build: cpp_pch): pybind11,
// torch's Python casters and the engine's headers, which every bind_*.cpp includes through
// binding.h, parsed once per build rather than once per file.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "tdstore/tdstore.h"
