#!/usr/bin/env bash
# The main job: cache Fashion-MNIST into stores (skipped when cached and valid), train an MLP
# with the loader and a compiled training step, evaluate on the test set. Run it twice: the
# second run imports nothing, traces nothing and recomputes no feature, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/tools/fashion_mnist "$@"
