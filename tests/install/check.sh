#!/usr/bin/env bash
# Checks an installed tdstore. $1: the DESTDIR the install went to.
# - tests/install/consumer.cpp builds with only `pkg-config --cflags --libs tdstore` and runs;
# - tests/install/consumer_storage.cpp builds with only `pkg-config ... tdstore-storage` (no
#   libtorch on its command line) and reads the store the first one wrote;
# - the installed tdstore binary links no libtorch and finds its library through its
#   relocatable rpath ($ORIGIN), with no LD_LIBRARY_PATH: the staged prefix is not the
#   configured one, which is what a custom prefix looks like to the binary.
set -euo pipefail
stage="$1"
here="$(dirname "$0")"
pc=$(find "$stage" -name tdstore.pc | head -1)
[ -n "$pc" ] || { echo "no tdstore.pc installed"; exit 1; }
[ -f "$(dirname "$pc")/tdstore-storage.pc" ] || { echo "no tdstore-storage.pc installed"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
export PKG_CONFIG_PATH="$(dirname "$pc")"
prefix="$stage$(pkg-config --variable=prefix tdstore)"
flags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs tdstore)
g++ "$here/consumer.cpp" -o "$stage/consumer" $flags
LD_LIBRARY_PATH="$libdir" "$stage/consumer" "$stage/consumer-store"

storage_flags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs tdstore-storage)
case "$storage_flags" in *torch*|*c10*) echo "tdstore-storage.pc names libtorch: $storage_flags"; exit 1;; esac
g++ "$here/consumer_storage.cpp" -o "$stage/consumer_storage" $storage_flags
LD_LIBRARY_PATH="$libdir" "$stage/consumer_storage" "$stage/consumer-store" "$stage/no-such-store"

bin=$(find "$stage" -path '*/bin/tdstore' | head -1)
test -x "$bin" || { echo "tdstore binary not installed"; exit 1; }
if ldd "$bin" | grep -E 'libtorch|libc10'; then echo "the installed tdstore links libtorch"; exit 1; fi
if ldd "$bin" | grep -q 'not found'; then ldd "$bin"; echo "the installed tdstore does not find its libraries"; exit 1; fi
env -u LD_LIBRARY_PATH "$bin" info "$stage/consumer-store" >/dev/null

# libtdstore exports the public API only, and holds no copy of the engine: tdstore::storage::
# lives in libtdstore_storage alone (one catalog registry per process), which libtdstore links.
# Neither exports detail:: internals.
so=$(find "$stage" -name libtdstore.so | head -1)
[ -n "$so" ] || { echo "libtdstore.so not installed"; exit 1; }
internal=$(nm -DC --defined-only "$so" | grep -cE 'tdstore::(storage|detail)::' || true)
[ "$internal" -eq 0 ] || { nm -DC --defined-only "$so" | grep -E 'tdstore::(storage|detail)::' | head; echo "libtdstore.so defines $internal engine or detail symbols"; exit 1; }
readelf -d "$so" | grep -q 'NEEDED.*libtdstore_storage' || { echo "libtdstore.so does not link libtdstore_storage"; exit 1; }
storage_so=$(find "$stage" -name libtdstore_storage.so | head -1)
[ -n "$storage_so" ] || { echo "libtdstore_storage.so not installed"; exit 1; }
detail=$(nm -DC --defined-only "$storage_so" | grep -c 'tdstore::detail::' || true)
[ "$detail" -eq 0 ] || { echo "libtdstore_storage.so exports $detail detail:: symbols"; exit 1; }

echo "install check: consumers built from pkg-config, the CLI runs through its rpath without libtorch, one copy of the engine"
