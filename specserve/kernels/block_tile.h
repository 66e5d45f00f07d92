// What both block-kernel builds (AVX2 in block_matmul.cpp, AVX-512 in block_matmul_avx512.cpp) share:
// the arguments of one call, the prefetching of weight columns and the loop over tiles.
#pragma once
#include <algorithm>
#include <cstdint>

namespace specserve {
namespace block {

struct Args {
  const uint8_t* qs;  // [N, row_bytes]
  const float* d;     // [N, nblocks]
  const float* m;     // [N, nblocks] (Q4)
  const float* x;     // [M, K]
  const float* xsum;  // [M, nblocks] (Q4, AVX2 build only)
  float* y;           // [M, N]
  int64_t N, K, nblocks, row_bytes;
};

// Ask for column n's packed bytes, scales and mins ahead of use. A column's three streams are only a
// few cache lines each, too short for the hardware prefetcher to get ahead of them, and one row's
// work per block (a few ns) is far less than a miss to L3 or DRAM costs: without this, a one-row pass
// over weights that are not in L2 runs at a third of the memory bandwidth. (Inline asm: GCC deleted
// loops of __builtin_prefetch here as side-effect free.)
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) asm volatile("prefetcht0 %0" : : "m"(c[off]));
}

inline void prefetch_column(const Args& a, int64_t n) {
  prefetch_lines(a.qs + n * a.row_bytes, a.row_bytes);
  prefetch_lines(a.d + n * a.nblocks, a.nblocks * 4);
  if (a.m) prefetch_lines(a.m + n * a.nblocks, a.nblocks * 4);
}

constexpr int64_t PREFETCH_COLUMNS = 4;

// Output columns n0 .. n1-1 of an M-row call, in groups of 16 columns (outer) and row tiles of up to
// TILE rows (inner), so a group's weights stay in L1 while every row tile reads them. tile(rows, r0,
// g0, g1) computes columns g0 .. g1-1 for rows r0 .. r0+rows-1.
template <int TILE, class Tile>
inline void for_each_tile(int64_t M, int64_t n0, int64_t n1, Tile&& tile) {
  constexpr int64_t GROUP = 16;
  for (int64_t g = n0; g < n1; g += GROUP) {
    const int64_t g1 = std::min(g + GROUP, n1);
    for (int64_t r0 = 0; r0 < M; r0 += TILE) tile(static_cast<int>(std::min<int64_t>(TILE, M - r0)), r0, g, g1);
  }
}

// The AVX-512 build of the kernel over output columns n0 .. n1-1 (block_matmul_avx512.cpp); call it only
// where cpu_has_avx512().
void run_avx512(const Args& a, int64_t M, int64_t n0, int64_t n1, bool q4);
bool cpu_has_avx512();

}  // namespace block
}  // namespace specserve
