#!/usr/bin/env bash
# Installs the Debian packages tdstore needs (when missing) and builds it into build/.
# Safe to run repeatedly; used by scripts/main-job.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ pkg-config meson ninja-build libtorch-dev liblmdb-dev libzstd-dev libxxhash-dev
          libgtest-dev libfmt-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev zlib1g-dev libssl-dev
          libgloo-dev dataset-fashion-mnist python3-numpy clang libclang-rt-14-dev
          libopenblas0-pthread python3-torch python3-dev pybind11-dev python3-pytest clang-format
          python3-mesonpy python3-venv python3-pip python3-tqdm ccache
          python3-h5py python3-zarr)  # importers and their benchmark (tools/bench_python.py)
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

# The project's own targets build with -Werror: a warning fails the build (and the suite).
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release -Dwerror=true
elif ! meson introspect build --buildoptions |
     /usr/bin/python3 -c 'import json, sys; sys.exit(not any(o["name"] == "werror" and o["value"] for o in json.load(sys.stdin)))'; then
  meson configure build -Dwerror=true
fi
ninja -C build
