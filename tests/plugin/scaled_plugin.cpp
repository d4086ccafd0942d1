// A shared library built twice from this source with different PLUGIN_SCALE, standing for a
// library rebuilt between two runs: its compiled function has the same name, the same type
// name and a different build id.
#include <ATen/TensorOperators.h>

#include "tdstore/tdstore.h"

extern "C" __attribute__((visibility("default"))) at::Tensor scaled_plugin_run(
    tdstore::TensorDict& td, tdstore::CompileStats* stats) {
  auto compiled = tdstore::compile(
      "plugin_scaled", [](tdstore::TensorDict& d) { return d.get("x") * PLUGIN_SCALE; });
  at::Tensor r = compiled(td);
  *stats = compiled.stats();
  return r;
}
