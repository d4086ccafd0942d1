#!/usr/bin/env bash
# Builds and runs tests/install/consumer.cpp against an installed tdstore, using only
# `pkg-config --cflags --libs tdstore`. $1: the DESTDIR the install went to.
set -euo pipefail
stage="$1"
pc=$(find "$stage" -name tdstore.pc | head -1)
[ -n "$pc" ] || { echo "no tdstore.pc installed"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
export PKG_CONFIG_PATH="$(dirname "$pc")"
prefix="$stage$(pkg-config --variable=prefix tdstore)"
flags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs tdstore)
out="$stage/consumer"
g++ "$(dirname "$0")/consumer.cpp" -o "$out" $flags
test -x "$(find "$stage" -path '*/bin/tdstore' | head -1)" || { echo "tdstore binary not installed"; exit 1; }
LD_LIBRARY_PATH="$libdir" "$out" "$stage/consumer-store"
