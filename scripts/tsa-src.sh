#!/usr/bin/env bash
# The thread-safety analysis of src/: clang -fsyntax-only at -Wthread-safety
# -Werror=thread-safety over each of its files, TSA_JOBS at once (default: one per core; the locks are
# storage::Mutex and detail::ForkSafeRecursiveMutex, what they guard marked GUARDED_BY and the
# functions that need them REQUIRES: storage/mutex.h). storage/ is analysed by build-san. The
# code that runs is compiled by g++ (build/); clang parses libtorch's and fmt's headers here
# through the shims in scripts/tsa/include/ (bits/c++config.h there says why). Exit 1 with the
# diagnostics when a guarded field is used without its lock.
set -uo pipefail
cd "$(dirname "$0")/.."
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety
       -isystem scripts/tsa/include -I. -Iinclude -I/usr/include/torch/csrc/api/include
       -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ls src/*.cpp | xargs -P "${TSA_JOBS:-$(nproc)}" -I{} clang++ "${flags[@]}" {} >"$log" 2>&1; then
  echo "thread-safety analysis of src/: clean"
else
  grep -E "error|warning" "$log" | head -40
  echo "thread-safety analysis of src/: FAILED"
  exit 1
fi
