#!/usr/bin/env bash
# The int8 VNNI kernel alone, one thread, on random packed blocks of the 1.5B's shapes (no torch): for
# timing kernel variants in seconds instead of a two-minute extension build (docs/decisions.md#q8-quantiser).
#   bash bench/q8_harness/run.sh [path/to/q8_matmul_avx512.cpp]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kernels=$here/../../specserve/kernels
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/harness.cpp" "$here/ops.h" "$kernels/q8_blocks.h" "$kernels/gguf_blocks.h" "$tmp/"
cp "${1:-$kernels/q8_matmul_avx512.cpp}" "$tmp/kernel.cpp"
g++ -O3 -mavx2 -mfma -mf16c -I"$tmp" "$tmp/harness.cpp" "$tmp/kernel.cpp" -o "$tmp/harness" 2>&1 | grep -v Wpsabi | grep error || true
for m in 1 8 16; do
  "$tmp/harness" 12 "$m" 1536 17920  # Q4_K: gate_up
  "$tmp/harness" 14 "$m" 8960 1536   # Q6_K: down
done
