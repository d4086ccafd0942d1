#!/usr/bin/env bash
# Runs each libFuzzer target of build-san (scripts/build-san.sh: clang, ASan + UBSan) for
# SECONDS (default 20) on its corpus, FUZZ_JOBS at once (default: one per core). Exit 1 when a target
# crashes, leaks or trips a sanitizer; the input that did it is left as build-san/crash-* (add
# it to tests/fuzz/corpus/<target>/ once fixed). A longer run: bash scripts/fuzz.sh 600.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
bash scripts/build-san.sh
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run() {  # target: its corpus run; the log and exit status under $logs
  local work rc=0; work=$(mktemp -d)
  build-san/tests/fuzz/fuzz_$1 -seed=1 -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix=build-san/ "$work" tests/fuzz/corpus/$1 >"$logs/$1.log" 2>&1 || rc=$?
  echo "$rc" >"$logs/$1.rc"
  rm -rf "$work"
}
targets=(directory catalog_value records manifest compressed npy safetensors idx tensordict)
jobs=${FUZZ_JOBS:-$(nproc)}
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run "$target" &
done
wait
status=0
for target in "${targets[@]}"; do
  if [ "$(cat "$logs/$target.rc" 2>/dev/null)" = 0 ]; then
    echo "fuzz_$target: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$logs/$target.log")"
  else
    echo "fuzz_$target: FAILED"; grep -E 'ERROR|SUMMARY|runtime error' "$logs/$target.log" | head -5
    status=1
  fi
done
exit $status
