#!/usr/bin/env bash
# The one sanitizer build (build-san): storage/ (torch-free), its tests and the libFuzzer targets,
# by clang with AddressSanitizer and UndefinedBehaviorSanitizer, at -Wthread-safety -Werror, so
# that one compilation both checks the GUARDED_BY/REQUIRES annotations and instruments the
# code. scripts/test.sh runs build-san/tests/storage_test; scripts/fuzz.sh the fuzz targets.
# Exit 1, with the first diagnostics, when it does not build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build-san/build.ninja ]; then
  CC=clang CXX=clang++ meson setup build-san -Dstorage_only=true -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debug -Dwerror=true \
    -Dcpp_args=-Wthread-safety >/dev/null
fi
if ! ninja -C build-san >build-san/build.log 2>&1; then
  echo "build-san: the clang build failed (build-san/build.log):"
  grep -E 'error|warning' build-san/build.log | head -40
  exit 1
fi
