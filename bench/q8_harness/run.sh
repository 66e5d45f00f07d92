#!/usr/bin/env bash
# The int8 kernels alone, one thread, on random packed blocks of the 1.5B's shapes (no torch): for timing
# kernel variants in seconds instead of a minutes-long extension build (docs/decisions.md#q8-quantiser,
# #amx-int8, #q8-avx2). AMX rows say so and time nothing on a CPU without it; an AVX2-only CPU times the
# AVX2 build alone.
#   bash bench/q8_harness/run.sh [q8_matmul_avx512.cpp [q8_matmul_amx.cpp [q8_matmul_avx2.cpp [q8_avx2.h]]]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kernels=$here/../../specserve/kernels
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/harness.cpp" "$here/ops.h" "$kernels/q8_blocks.h" "$kernels/q8_avx512.h" "$kernels/gguf_blocks.h" "$tmp/"
cp "${1:-$kernels/q8_matmul_avx512.cpp}" "$tmp/kernel.cpp"
cp "${2:-$kernels/q8_matmul_amx.cpp}" "$tmp/kernel_amx.cpp"
cp "${3:-$kernels/q8_matmul_avx2.cpp}" "$tmp/kernel_avx2.cpp"
cp "${4:-$kernels/q8_avx2.h}" "$tmp/q8_avx2.h"
cp "$kernels/q8_matmul_avxvnni.cpp" "$tmp/kernel_avxvnni.cpp"
g++ -O3 -mavx2 -mfma -mf16c -I"$tmp" "$tmp/harness.cpp" "$tmp/kernel.cpp" "$tmp/kernel_avx2.cpp" "$tmp/kernel_avxvnni.cpp" \
  -o "$tmp/harness" 2>&1 | grep -v Wpsabi | grep error || true
if grep -q avx512_vnni /proc/cpuinfo; then builds="vnni avx2 amx amx-overhead"; else builds="avx2"; fi
if grep -q avx_vnni /proc/cpuinfo; then builds="$builds avxvnni"; fi
for m in 1 8 16 32; do
  for build in $builds; do
    "$tmp/harness" 12 "$m" 1536 17920 $build  # Q4_K: gate_up
    "$tmp/harness" 14 "$m" 8960 1536 $build   # Q6_K: down
  done
done
"$tmp/harness" 12 20 1536 256 avxvnni-emulated  # the AVX-VNNI build's bits, on any AVX2 CPU
"$tmp/harness" 14 20 1536 256 avxvnni-emulated
if grep -q avx512bw /proc/cpuinfo; then
  "$tmp/harness" 12 20 1536 256 amx-emulated  # the tile build's bits, on any AVX-512 CPU
  "$tmp/harness" 14 20 1536 256 amx-emulated
fi
