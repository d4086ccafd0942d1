#!/usr/bin/env bash
# The main job on a slice of Fashion-MNIST, twice: the second run must reuse the cached stores,
# load its graphs instead of tracing, and read its features. $1: the fashion_mnist binary.
set -euo pipefail
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
# 3,000 rows in batches of 128: the last batch holds 56, and one dynamic graph serves both sizes.
first=$("$1" --store "$store" --limit 3000 --epochs 1 --batch 128)
echo "$first"
head -1 <<<"$first" | grep -q "^blas: "  # the first line names the BLAS libtorch runs on
if ldconfig -p | grep -q libopenblas; then head -1 <<<"$first" | grep -q "^blas: OpenBLAS"; fi
grep -q "imported into" <<<"$first"
grep -q "fmnist_train_step: 2 traced, 0 loaded.*, 1 graph entry$" <<<"$first"
grep -q "fmnist_predict: 1 traced, 0 loaded.*, 1 graph entry$" <<<"$first"
second=$("$1" --store "$store" --limit 3000 --epochs 1 --batch 128)
echo "$second"
grep -q "reused the cached stores, no import" <<<"$second"
grep -q "fmnist_train_step: 0 traced, 1 loaded.*, 1 graph entry$" <<<"$second"
grep -q "fmnist_predict: 0 traced, 1 loaded.*, 1 graph entry$" <<<"$second"
grep -q "second run: no import, zero traces (graphs loaded), features read, not recomputed" <<<"$second"
acc=$(sed -n 's/^final test accuracy //p' <<<"$second")
awk -v a="$acc" 'BEGIN { exit !(a > 0.6) }'  # 3,000 rows, one epoch: well above chance (0.1)
echo "main job test: ok"
