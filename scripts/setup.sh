#!/usr/bin/env bash
# Installs the Debian packages tdstore needs (when missing) and builds it into build/.
# Safe to run repeatedly; used by scripts/main-job.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ pkg-config meson ninja-build libtorch-dev liblmdb-dev libzstd-dev libxxhash-dev
          libgtest-dev libfmt-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev zlib1g-dev
          libgloo-dev dataset-fashion-mnist python3-numpy clang libclang-rt-14-dev
          libopenblas0-pthread python3-torch python3-dev pybind11-dev python3-pytest)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release
fi
ninja -C build
