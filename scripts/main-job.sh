#!/usr/bin/env bash
# The main job: create a store, write tensors, reopen it in a new process and print it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
store="${1:-${TMPDIR:-/tmp}/tdstore-quickstart}"
./build/tools/quickstart write "$store"
./build/tools/quickstart read "$store"     # a new process
./build/tools/tdstore info "$store"
./build/tools/tdstore ls "$store"
./build/tools/tdstore verify "$store"
