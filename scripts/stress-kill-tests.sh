#!/usr/bin/env bash
# Runs every kill test (a test that SIGKILLs a child process at a point measured in its progress
# and asserts what the kill left) many times in a row beside CPU hogs (stress-ng --cpu), and
# reports each test's failures. A loaded machine deschedules the parent between reading a
# child's progress and killing it, so kills land later than on an idle machine: inside a later
# operation, between two, after the child's exit. Every kill test must pass wherever its kills
# land. Not part of scripts/test.sh (it takes long); run it after changing a kill test or
# tests/kill_harness.h.
#
#   scripts/stress-kill-tests.sh [-n REPS] [-c HOGS] [-f MS] [--no-build] [--list] [PATTERN...]
#
#   -n REPS     runs of each test (default 20)
#   -c HOGS     stress-ng --cpu workers beside the tests (default 4; 0: none)
#   -f MS       also freeze the test process (SIGSTOP, not its children) for MS ms at random
#               moments, as a scheduler that deschedules it would (default 0: never); a way to
#               make late kills common, so that every landing's assertions are exercised
#   --no-build  use build/ as it is (default: build the test binaries first)
#   --list      print the kill tests and exit
#   PATTERN     run only the tests whose name contains one of them (e.g. FourRanks, Crash.)
#
# Logs of failed runs go to build/stress-kill/<time>/. Exits 0 only when every run of every
# selected test passed (a skipped run counts as failed: it proved nothing).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
build=$root/build

# binary | test | environment (space-separated NAME=VALUE)
kill_tests=(
  "storage_test|Crash.KilledWriterLeavesLastCommittedState|"
  "storage_test|KeyIndex.AKilledWriterLeavesTheLastCommittedState|"
  "storage_test|ReaderTable.ATableNobodyHasOpenIsRebuilt|"
  "storage_test|Space.ReadersInOtherProcessesAreProtectedAndDeadOnesAreCleared|"
  "tensordict_test|Crash.KilledTensorDictWriterLeavesLastCommittedState|"
  "tensordict_test|Lazy.KilledComputerNeverPairsPropertyWithForeignProvenance|"
  "tensordict_test|Append.KilledCachingJobResumesExactly|"
  "tensordict_test|Dataset.KilledWritersResumeAndNoRowIsLostOrRepeated|"
  "tensordict_test|Dataset.FourRanksCacheFashionMnistOverGlooAndSurviveKills|"
  "cli_test|Cli.CompactKilledMidwayLosesNothing|TDSTORE_CLI=@/tools/tdstore"
)

reps=20 hogs=4 freeze=0 build_first=1 list=0 patterns=()
while [ $# -gt 0 ]; do
  case $1 in
    -n) reps=$2; shift 2 ;;
    -c) hogs=$2; shift 2 ;;
    -f) freeze=$2; shift 2 ;;
    --no-build) build_first=0; shift ;;
    --list) list=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) patterns+=("$1"); shift ;;
  esac
done

selected=()
for entry in "${kill_tests[@]}"; do
  IFS='|' read -r _ name _ <<<"$entry"
  if [ ${#patterns[@]} -eq 0 ]; then selected+=("$entry"); continue; fi
  for p in "${patterns[@]}"; do
    if [[ $name == *"$p"* ]]; then selected+=("$entry"); break; fi
  done
done
if [ $list -eq 1 ]; then
  for entry in "${selected[@]}"; do IFS='|' read -r bin name _ <<<"$entry"; echo "$bin $name"; done
  exit 0
fi
if [ ${#selected[@]} -eq 0 ]; then echo "no kill test matches: ${patterns[*]}" >&2; exit 2; fi

if [ "$build_first" -eq 1 ]; then
  flock /tmp/tdstore-ninja.lock ninja -C "$build" tests/storage_test tests/tensordict_test \
    tests/cli_test tools/tdstore >/dev/null || { echo "build failed" >&2; exit 1; }
fi
for entry in "${selected[@]}"; do
  IFS='|' read -r bin _ _ <<<"$entry"
  [ -x "$build/tests/$bin" ] || { echo "missing $build/tests/$bin (scripts/setup.sh)" >&2; exit 1; }
done

# The runs use a copy of the binaries and libraries, taken under the build lock: build/ is
# shared, and a library relinked under a running test would fail it for no fault of its own.
logs=$build/stress-kill/$(date +%Y%m%d-%H%M%S)
snap=$logs/bin
mkdir -p "$snap/tests" "$snap/tools"
# shellcheck disable=SC2016  # $1 and $2 are the inner shell's
flock /tmp/tdstore-ninja.lock sh -c 'cd "$1" && cp -L tests/storage_test tests/tensordict_test \
  tests/cli_test "$2/tests/" && cp -L tools/tdstore "$2/tools/" &&
  cp -L libtdstore.so.0 libtdstore_storage.so.0 "$2/"' sh "$build" "$snap" ||
  { echo "could not copy the binaries to $snap" >&2; exit 1; }

hog_pid=""
stop_hogs() {
  rm -rf "$snap"
  if [ -n "$hog_pid" ]; then
    kill -TERM -- "-$hog_pid" 2>/dev/null  # the process group setsid gave stress-ng
    wait "$hog_pid" 2>/dev/null
    hog_pid=
  fi
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM
if [ "$hogs" -gt 0 ]; then
  command -v stress-ng >/dev/null || { echo "stress-ng is not installed (apt-get install -y stress-ng)" >&2; exit 1; }
  setsid stress-ng --cpu "$hogs" --quiet >/dev/null 2>&1 &
  hog_pid=$!
fi

# Runs a command; with -f, from a parent that stops and continues it (only it: its children
# run on) for $freeze ms at random moments until it exits. That parent reaps it only at the
# end (waitid WNOWAIT), so the pid it signals is never another process's.
freezer='
import os, random, signal, sys, time
freeze, argv = int(sys.argv[1]) / 1000, sys.argv[2:]
pid = os.fork()
if pid == 0:  # its own process group, whose parent (this one) stays: never an orphaned group
    os.setpgid(0, 0)  # with a stopped member, which the kernel would SIGHUP
    os.execvp(argv[0], argv)
def stop(signum, frame):  # interrupted: end the test too
    os.kill(pid, signal.SIGCONT), os.kill(pid, signal.SIGKILL)
signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGTERM, stop)
while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
    time.sleep(random.uniform(0, 3 * freeze))
    os.kill(pid, signal.SIGSTOP)
    time.sleep(freeze)
    os.kill(pid, signal.SIGCONT)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
sys.exit(code if code >= 0 else 128 - code)  # killed by a signal: 128 + signal, as a shell says
'
run() {
  if [ "$freeze" -gt 0 ]; then python3 -c "$freezer" "$freeze" "$@"; else "$@"; fi
}

echo "kill tests: ${#selected[@]}, $reps runs each, beside stress-ng --cpu $hogs on $(nproc) CPUs" \
  "$([ "$freeze" -gt 0 ] && echo "(test process frozen for $freeze ms at random moments)")"
echo "logs of failed runs: $logs"
start_all=$SECONDS total_runs=0 total_failed=0 summary=()
for entry in "${selected[@]}"; do
  IFS='|' read -r bin name envs <<<"$entry"
  failed=0 start=$SECONDS
  for ((i = 1; i <= reps; i++)); do
    log=$logs/$name.$i.log
    t0=$SECONDS
    # shellcheck disable=SC2086  # envs: NAME=VALUE words
    run env ${envs//@/$snap} "$snap/tests/$bin" --gtest_filter="$name" --gtest_brief=1 >"$log" 2>&1
    code=$?
    verdict=passed
    if [ $code -ne 0 ]; then
      verdict="FAILED (exit $code)"
    elif grep -q '\[  SKIPPED \]' "$log" || ! grep -q '\[  PASSED  \] 1 test' "$log"; then
      verdict="FAILED (skipped, or did not run)"
    fi
    total_runs=$((total_runs + 1))
    landings=$(grep -m1 'kills landed' "$log")
    if [ "$verdict" = passed ]; then
      rm -f "$log"
    else
      failed=$((failed + 1)) total_failed=$((total_failed + 1))
      # The test's own failures (its children's expected ones are in the log too).
      grep -A6 -E '^\.\./tests/[a-z_]+\.(cpp|h):[0-9]+: Failure|error while loading' "$log" |
        head -40 | sed 's/^/      /'
    fi
    printf '  %-66s run %2d/%d %5ds  %s%s\n' "$name" "$i" "$reps" $((SECONDS - t0)) "$verdict" \
      "${landings:+  ($landings)}"
  done
  summary+=("$(printf '%-70s %3d runs, %3d failed, %5ds' "$name" "$reps" "$failed" $((SECONDS - start)))")
done
stop_hogs
echo "== summary (stress-ng --cpu $hogs)"
printf '%s\n' "${summary[@]}"
echo "$total_runs runs, $total_failed failed, $((SECONDS - start_all)) s"
[ "$total_failed" -eq 0 ] && rmdir "$logs" 2>/dev/null
[ "$total_failed" -eq 0 ]
