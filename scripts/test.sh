#!/usr/bin/env bash
# The whole test suite: a formatting check, the GoogleTest suites through meson (every build
# uses -Werror), storage/ built once more by clang (ASan + UBSan, -Wthread-safety -Werror), the
# Python package pip-installed (its wheel's configuration built from ccache's copies of build/'s
# objects) and its pytest suite, beside which run the analysis of src/, storage/'s tests under
# the sanitizers and the libFuzzer targets (20 s each), an install
# check (tests/install/check.sh: programs built from the installed headers and pkg-config files,
# the installed CLI without libtorch, one copy of the engine) and CLI and Python smoke sets
# against the installed files. The wheel's build reuses build/'s objects through ccache. Ends
# with each step's time and "N passed, N failed". No test depends on the machine's speed: it
# passes beside CPU hogs (README, "Testing").
set -uo pipefail
cd "$(dirname "$0")/.."

# Each step's wall time, printed at the end (the suite's time is a budget: README, "Testing").
step_names=() step_secs=() step_start=$SECONDS
step() {  # ends the step in progress and starts the one named $1
  if [ ${#step_names[@]} -gt 0 ]; then step_secs+=($((SECONDS - step_start))); fi
  step_names+=("$1") step_start=$SECONDS
  echo "== $1"
}
step "setup and build (scripts/setup.sh)"
bash scripts/setup.sh || exit 1

# ccache's directory stays the one build/ was compiled into (ccache 4 follows XDG_CACHE_HOME,
# set below), so the wheel's build finds build/'s objects there.
if command -v ccache >/dev/null; then export CCACHE_DIR="${CCACHE_DIR:-$(ccache -k cache_dir)}"; fi
# Keys and graph caches of the tests' own (tdstore/trust.h): the suite never writes into the
# home directory of the user running it.
export XDG_CONFIG_HOME="$PWD/build/test-home/config" XDG_CACHE_HOME="$PWD/build/test-home/cache"
unset TDSTORE_KEY_FILE TDSTORE_GRAPH_CACHE_BYTES
rm -rf build/test-home

results=build/test-results
rm -rf "$results" && mkdir -p "$results"
failed_steps=0

step "formatting (clang-format --dry-run --Werror, .clang-format) and file sizes"
# A file has one concern (docs/DESIGN.md, "Layers"): no source file outside tests/ over 600 lines.
long=$(git ls-files storage src python tools include | grep -E '\.(cpp|h|c|py)$' |
  xargs wc -l | awk '$2 != "total" && $1 > 600 {print "  " $2 ": " $1 " lines"}')
if [ -n "$long" ]; then
  echo "source files over 600 lines (split them by concern):"; echo "$long"
  failed_steps=$((failed_steps + 1))
fi
unformatted=$(git ls-files '*.cpp' '*.h' '*.c' | while read -r f; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
if [ -n "$unformatted" ]; then
  echo "not formatted (run clang-format -i on them):"; echo "$unformatted" | sed 's/^/  /'
  failed_steps=$((failed_steps + 1))
else
  echo "formatting: ok"
fi

step "meson test"
GTEST_OUTPUT="xml:$PWD/$results/" meson test -C build --print-errorlogs || failed_steps=$((failed_steps + 1))

step "storage/ by clang (build-san: ASan + UBSan, -Wthread-safety -Werror)"
san_ok=0
if bash scripts/build-san.sh; then echo "thread-safety analysis of storage/: clean"; san_ok=1
else failed_steps=$((failed_steps + 1)); fi

step "Python package: pip install into a virtual environment (a wheel of its own build, build-wheel), then pytest against it"
# Beside it, on the core pytest leaves idle (it keeps about 1.2 of 2 busy), in two queues whose
# logs are printed after it: the thread-safety analysis of src/, then build-san's storage tests
# (one process: ASan, UBSan, leaks); and the fuzz targets, one at a time for a fixed time each.
mkdir -p "$results/asan" "$results/side"
(
  start=$SECONDS status=0
  TSA_JOBS=1 bash scripts/tsa-src.sh >"$results/side/tsa-src.log" 2>&1 || status=1
  if [ "$san_ok" = 1 ]; then
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      GTEST_OUTPUT="xml:$PWD/$results/asan/storage_test.xml" \
      ./build-san/tests/storage_test --gtest_brief=1 >"$results/side/asan.log" 2>&1 || status=1
  fi
  echo "$((SECONDS - start))" >"$results/side/analysis.secs"
  exit $status
) &
analysis_pid=$!
(
  start=$SECONDS status=0
  if [ "$san_ok" = 1 ]; then
    FUZZ_JOBS=1 bash scripts/fuzz.sh 20 >"$results/side/fuzz.log" 2>&1 || status=1
  fi
  echo "$((SECONDS - start))" >"$results/side/fuzz.secs"
  exit $status
) &
fuzz_pid=$!
# As a user installs it (README, "Python"): meson-python builds the wheel's configuration
# (-Dwheel=true: the engine linked into the extension, pyproject.toml) in build-wheel, kept
# between runs, into a venv over Debian's torch. Its objects are compiled as build/'s (same
# flags; -Dwerror=true as there), so meson picks them from ccache (scripts/setup.sh) rather than
# compiling the engine twice.
venv="$PWD/build/venv"
rm -rf "$venv"
if /usr/bin/python3 -m venv --system-site-packages "$venv" &&
   "$venv/bin/pip" install -q --no-index --no-build-isolation --config-settings=builddir=build-wheel \
     --config-settings=setup-args=-Dwerror=true . &&
   "$venv/bin/python" -c 'import tdstore, sys; print("tdstore", tdstore.__version__, "from", tdstore.__file__); sys.exit("/build/venv/" not in tdstore.__file__)'; then
  TDSTORE_PYTHONPATH=installed TDSTORE_CLI="$venv/bin/tdstore" \
    "$venv/bin/python" -m pytest tests/python -p no:cacheprovider --junitxml="$results/python/pytest.xml" \
    || failed_steps=$((failed_steps + 1))
else
  echo "pip install into $venv failed"; failed_steps=$((failed_steps + 1))
fi
command -v ccache >/dev/null && ccache --show-stats 2>/dev/null | grep -E "^ *(Hits|Misses):" | head -2

step "beside pytest: src/'s thread-safety analysis and build-san's storage tests; the fuzz targets"
wait "$analysis_pid" || failed_steps=$((failed_steps + 1))
wait "$fuzz_pid" || failed_steps=$((failed_steps + 1))
cat "$results/side/tsa-src.log" "$results/side/asan.log" "$results/side/fuzz.log" 2>/dev/null
echo "(their own times: analysis and storage tests $(cat "$results/side/analysis.secs") s, fuzz $(cat "$results/side/fuzz.secs") s)"

step "install check"
stage="$PWD/build/stage"
rm -rf "$stage"
if meson install -C build --destdir "$stage" >/dev/null && bash tests/install/check.sh "$stage"; then
  echo "install check: ok"
  install_ok=1
  step "CLI smoke tests against the installed binary (no LD_LIBRARY_PATH: its rpath)"
  libdir=$(dirname "$(find "$stage" -name 'libtdstore.so' | head -1)")
  TDSTORE_CLI="$(find "$stage" -path '*/bin/tdstore' | head -1)" \
    GTEST_OUTPUT="xml:$PWD/$results/installed/" ./build/tests/cli_test --gtest_brief=1 \
    --gtest_filter='Cli.InfoJson:Cli.LsTreeFlatAndJson:Cli.ImportExportRoundTrip:Cli.ErrorsAndExitCodes:Cli.TheBinaryLinksNoLibtorch' \
    || failed_steps=$((failed_steps + 1))
  site=$(dirname "$(find "$stage" -path '*/dist-packages/tdstore/__init__.py' | head -1)")
  if [ -n "$site" ] && [ "$site" != "." ]; then
    # The whole suite ran against the pip-installed package above; here what differs with
    # meson's own install layout: the package imports from dist-packages, finds its engine and
    # CLI, its stubs match, a newcomer's relative paths work.
    step "Python smoke set against meson's installed package"
    TDSTORE_PYTHONPATH=1 PYTHONPATH="$(dirname "$site")" LD_LIBRARY_PATH="$libdir" \
      TDSTORE_CLI="$(find "$stage" -path '*/bin/tdstore' | head -1)" \
      /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python/test_errors.py \
      tests/python/test_stubs.py tests/python/test_relative_paths.py || failed_steps=$((failed_steps + 1))
  fi
else
  echo "install check: FAILED"
  install_ok=0
fi

# Count test cases from the GoogleTest XML reports.
read -r total failures < <(find "$results" -name '*.xml' -exec cat {} + 2>/dev/null |
  grep -o '<testsuites [^>]*' |
  sed -E 's/.* tests="([0-9]+)".* failures="([0-9]+)".*/\1 \2/' |
  awk '{t += $1; f += $2} END {print t + 0, f + 0}')
# pytest's report: one <testsuite> with tests, failures and errors.
read -r pytotal pyfailed < <(cat "$results/python/pytest.xml" 2>/dev/null | grep -o '<testsuite [^>]*' |
  sed -E 's/.* errors="([0-9]+)".* failures="([0-9]+)".* tests="([0-9]+)".*/\3 \1 \2/' |
  awk '{t += $1; f += $2 + $3} END {print t + 0, f + 0}')
total=$((total + pytotal))
failures=$((failures + pyfailed))
passed=$((total - failures + install_ok))
failed=$((failures + (1 - install_ok)))
if [ "$failed" -eq 0 ] && [ "$failed_steps" -gt 0 ]; then failed=$failed_steps; fi
step_secs+=($((SECONDS - step_start)))
echo "== step times"
for i in "${!step_names[@]}"; do printf '%6d s  %s\n' "${step_secs[$i]}" "${step_names[$i]}"; done
printf '%6d s  total\n' "$SECONDS"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$failed_steps" -eq 0 ]
