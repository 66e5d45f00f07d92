#!/usr/bin/env bash
# The int8 VNNI and AMX kernels alone, one thread, on random packed blocks of the 1.5B's shapes (no
# torch): for timing kernel variants in seconds instead of a two-minute extension build
# (docs/decisions.md#q8-quantiser, #amx-int8). AMX rows say so and time nothing on a CPU without it.
#   bash bench/q8_harness/run.sh [path/to/q8_matmul_avx512.cpp [path/to/q8_matmul_amx.cpp]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kernels=$here/../../specserve/kernels
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/harness.cpp" "$here/ops.h" "$kernels/q8_blocks.h" "$kernels/q8_avx512.h" "$kernels/gguf_blocks.h" "$tmp/"
cp "${1:-$kernels/q8_matmul_avx512.cpp}" "$tmp/kernel.cpp"
cp "${2:-$kernels/q8_matmul_amx.cpp}" "$tmp/kernel_amx.cpp"
g++ -O3 -mavx2 -mfma -mf16c -I"$tmp" "$tmp/harness.cpp" "$tmp/kernel.cpp" -o "$tmp/harness" 2>&1 \
  | grep -v Wpsabi | grep error || true
for m in 1 8 16 32; do
  for build in vnni amx amx-overhead; do
    "$tmp/harness" 12 "$m" 1536 17920 $build  # Q4_K: gate_up
    "$tmp/harness" 14 "$m" 8960 1536 $build   # Q6_K: down
  done
done
"$tmp/harness" 12 20 1536 256 amx-emulated  # the tile build's bits, on any AVX-512 CPU
"$tmp/harness" 14 20 1536 256 amx-emulated
