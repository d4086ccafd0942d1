#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS (default 20) on
# its corpus. Exit 1 when a target crashes, leaks or trips a sanitizer; the input that did it
# is left as build-fuzz/crash-* (add it to tests/fuzz/corpus/<target>/ once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
if [ ! -f build-fuzz/build.ninja ]; then
  CXX=clang++ CC=clang meson setup build-fuzz -Dstorage_only=true -Dfuzz=true -Dtests=false \
    -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true >/dev/null
fi
if ! ninja -C build-fuzz >build-fuzz/build.log 2>&1; then
  echo "fuzz targets: the clang build failed (build-fuzz/build.log):"; grep -E 'error' build-fuzz/build.log | head -5
  exit 1
fi
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
for target in directory catalog_value records manifest npy safetensors idx; do
  work=$(mktemp -d)
  if build-fuzz/tests/fuzz/fuzz_$target -seed=1 -max_total_time="$seconds" -print_final_stats=1 \
       -artifact_prefix=build-fuzz/ "$work" tests/fuzz/corpus/$target >"$work.log" 2>&1; then
    echo "fuzz_$target: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$work.log")"
  else
    echo "fuzz_$target: FAILED"; grep -E 'ERROR|SUMMARY|runtime error' "$work.log" | head -5
    status=1
  fi
  rm -rf "$work" "$work.log"
done
exit $status
