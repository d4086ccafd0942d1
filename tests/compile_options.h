// CompileOptions the compile tests share.
#pragma once

#include "tdstore/compile.h"

namespace tdstore::testing {

// Graphs kept in memory only: a test's calls are not influenced by another's stored graphs.
inline CompileOptions no_persist() {
  CompileOptions o;
  o.persist = false;
  return o;
}

}  // namespace tdstore::testing
