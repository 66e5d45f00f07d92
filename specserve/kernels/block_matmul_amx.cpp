// The block kernel on Intel AMX (Sapphire Rapids and later), for weights packed by block_pack_amx;
// block_linear (block_matmul.cpp) sends it passes of more than 8 rows.
//
// Why: past a few rows the AVX builds are compute-bound (AVX-512: two FMAs per row per 16 weights,
// ~1.7 ms per further row for the embedded model), so a verify pass over 8 sequences x (k + 1)
// tokens costs nearly k + 1 decode steps and drafting cannot pay. The tile unit does a [rows x 32] x
// [32 x 16] product per instruction: ~0.6 ms per further row here (measured: each product of 16 rows
// takes ~45 cycles with real data on this VM, a third of the nominal rate). One row is latency-bound
// (products, a tile store, then the scaling), ~2x slower than AVX-512, hence the threshold.
//
// Numerics, still fp32-exact inputs: AMX multiplies bf16 (8 significant bits). A block's 4-bit q
// (or Q8's 8-bit q) is exact in bf16, and each fp32 activation is split into three bf16 pieces
// x = hi + mid + lo (truncations of the rest, so the split is exact: 24 = 3 x 8 significant bits).
// The tile unit multiplies those exactly and sums in fp32 (in its own order: AVX512-BF16's dot
// product does not reproduce it), giving t_b = sum_j q_j x_j for block b, and every output is then
// y = sum_b (d_b * t_b + m_b * xsum_b) in block order, one FMA at a time: the same order for every
// row whatever the rows beside it, so within this build a row's bits do not depend on the batch.
//
// Layout: the weights are regrouped at load time (block_pack_amx) into groups of 16 output columns:
// per (group, block), 256 bytes of nibbles (Q4) or 512 bytes (Q8) that unpack with a few shuffles
// into the tile unit's B layout [16 pairs of k][16 columns][2], and the group's 16 scales and mins
// per block side by side. Still 4.5 (Q4) / 8.5 (Q8) bits per weight, so one-row (memory-bound) steps
// read no more than before.
#include "ops.h"
#include "block_tile.h"

#include <sys/syscall.h>
#include <unistd.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16")

namespace specserve {
namespace amx {
namespace {

constexpr int GROUP = 16;         // output columns per tile
constexpr int MAX_ROWS = 16;      // activation rows per tile
constexpr int64_t ROW_SLICE = 128;  // rows per pass over the weights (a multiple of MAX_ROWS)
constexpr int BLOCK_WORDS = 512;  // one block of one group in B layout: 16 k-pairs x 16 columns x 2 bf16

// Tiles: the fp32 results and weights of two groups, the three activation pieces. (Macros: GCC's
// tile intrinsics paste the number into the register name.)
#define T_OUT 0
#define T_HI 1
#define T_MID 2
#define T_LO 3
#define T_W 4
#define T_OUT2 5
#define T_W2 6

struct alignas(64) TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles(int rows) {
  TileConfig c;
  for (int t : {T_OUT, T_OUT2, T_HI, T_MID, T_LO}) {
    c.rows[t] = rows;
    c.colsb[t] = 64;  // 16 fp32 outputs / 32 bf16 activations
  }
  for (int t : {T_W, T_W2}) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// Where value p (0..63) of the low (h = 0) or high (h = 1) nibbles of a Q4 group-block's 64-byte
// chunk c lands among the 512 unpacked words: the order unpack_q4 produces (per 128-bit lane,
// unpacklo/hi interleave bytes 0..7 / 8..15 of the lookups), which the packing follows.
inline int q4_word(int c, int h, int p) {
  const int lane = p >> 4, i = p & 15;
  return (c * 2 + h) * 64 + (i < 8 ? 0 : 32) + lane * 8 + (i & 7);
}

// 256 packed bytes -> 512 bf16 words in B layout. bf16(q) for q < 16 through two byte lookups (its
// low and high byte), interleaved into words.
inline void unpack_q4(const uint8_t* src, uint16_t* dst) {
  alignas(64) static const uint8_t lo_tab[16] = {0x00, 0x80, 0x00, 0x40, 0x80, 0xA0, 0xC0, 0xE0,
                                                 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70};
  alignas(64) static const uint8_t hi_tab[16] = {0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
                                                 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41};
  const __m512i tl = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(lo_tab)));
  const __m512i th = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(hi_tab)));
  const __m512i mask = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i v = _mm512_loadu_si512(src + 64 * c);
    const __m512i nib[2] = {_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask)};
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i l = _mm512_shuffle_epi8(tl, nib[h]), u = _mm512_shuffle_epi8(th, nib[h]);
      uint16_t* out = dst + (c * 2 + h) * 64;
      _mm512_storeu_si512(out, _mm512_unpacklo_epi8(l, u));
      _mm512_storeu_si512(out + 32, _mm512_unpackhi_epi8(l, u));
    }
  }
}

// 512 int8 (already in B order) -> 512 bf16 words (exact: |q| <= 128).
inline void unpack_q8(const int8_t* src, uint16_t* dst) {
#pragma GCC unroll 4
  for (int j = 0; j < 16; ++j) {
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32 * j))));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32 * j + 16))));
    _mm512_storeu_si512(dst + 32 * j, (__m512i)_mm512_cvtne2ps_pbh(b, a));  // words 0..15 from a
  }
}

struct Call {
  const uint8_t* w;      // [G, nblocks, 256 | 512] packed weights
  const float* d;        // [G, nblocks, 16]
  const float* m;        // [G, nblocks, 16] (Q4)
  const uint16_t* x[3];  // hi, mid, lo pieces, bf16 [M, K]
  const float* xsum;     // [M, nblocks] (Q4)
  float* y;              // [M, N]
  int64_t N, K, nblocks;
};

// Rows r0 .. r0+R-1 of groups g .. g+P-1 (P = 1 or 2), whose weights are unpacked in w[p]
// [nblocks][512]: first every block's tile products into t [nblocks][P][R][16], then the scaling,
// block after block. Two groups share each activation tile and give the tile unit two independent
// chains (one row's products are latency-bound). Scaling each block right after its tile store was
// 3x slower: loads that follow a tile store wait for it, and it waits for the products. Fields of c
// are copied to locals first, or the compiler would reload them after each tile store (which may
// write anywhere, as far as it knows).
template <int R, bool Q4, int P>
void row_tile(const Call& c, int64_t r0, int64_t g, uint16_t* const* w, float* t) {
  const int64_t nblocks = c.nblocks, stride = c.K * 2;  // bytes between activation rows
  const uint16_t *xh = c.x[0] + r0 * c.K, *xm = c.x[1] + r0 * c.K, *xl = c.x[2] + r0 * c.K;
  const uint16_t *w0 = w[0], *w1 = w[P - 1];
  for (int64_t b = 0; b < nblocks; ++b) {  // t[b][p][r][n] = sum_j q[n][j] x[r][j] over block b (hi, mid, lo)
    _tile_loadd(T_HI, xh + b * QK, stride);
    _tile_loadd(T_MID, xm + b * QK, stride);
    _tile_loadd(T_LO, xl + b * QK, stride);
    _tile_zero(T_OUT);
    _tile_loadd(T_W, w0 + b * BLOCK_WORDS, 64);
    _tile_dpbf16ps(T_OUT, T_HI, T_W);
    _tile_dpbf16ps(T_OUT, T_MID, T_W);
    _tile_dpbf16ps(T_OUT, T_LO, T_W);
    if (P == 2) {
      _tile_zero(T_OUT2);
      _tile_loadd(T_W2, w1 + b * BLOCK_WORDS, 64);
      _tile_dpbf16ps(T_OUT2, T_HI, T_W2);
      _tile_dpbf16ps(T_OUT2, T_MID, T_W2);
      _tile_dpbf16ps(T_OUT2, T_LO, T_W2);
    }
    _tile_stored(T_OUT, t + b * P * R * GROUP, 64);
    if (P == 2) _tile_stored(T_OUT2, t + (b * P + 1) * R * GROUP, 64);
  }
  const float* xsum = Q4 ? c.xsum + r0 * nblocks : nullptr;
  for (int p = 0; p < P; ++p) {
    const float* d = c.d + (g + p) * nblocks * GROUP;
    const float* m = Q4 ? c.m + (g + p) * nblocks * GROUP : nullptr;
    __m512 acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblocks; ++b) {  // acc[r] += d_b * t[b][p][r] (+ m_b * xsum[r][b])
      const float* tb = t + (b * P + p) * R * GROUP;
      const __m512 db = _mm512_loadu_ps(d + b * GROUP);
      if (Q4) {
        const __m512 mb = _mm512_loadu_ps(m + b * GROUP);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          acc[r] = _mm512_fmadd_ps(_mm512_load_ps(tb + r * GROUP), db, acc[r]);
          acc[r] = _mm512_fmadd_ps(mb, _mm512_set1_ps(xsum[r * nblocks + b]), acc[r]);
        }
      } else {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_load_ps(tb + r * GROUP), db, acc[r]);
      }
    }
    float* y = c.y + r0 * c.N + (g + p) * GROUP;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * c.N, acc[r]);
  }
}

template <bool Q4, int R = MAX_ROWS>
void row_tile_n(int rows, int groups, const Call& c, int64_t r0, int64_t g, uint16_t* const* w, float* t) {
  if constexpr (R > 1) {
    if (rows < R) return row_tile_n<Q4, R - 1>(rows, groups, c, r0, g, w, t);
  }
  if (groups == 2) row_tile<R, Q4, 2>(c, r0, g, w, t);
  else row_tile<R, Q4, 1>(c, r0, g, w, t);
}

// Groups g0 .. g1-1 for all M rows, two at a time: per slice of rows, each group's weights are
// unpacked once, then every row tile (16 rows) of the slice reads them from L1/L2.
template <bool Q4>
void run_groups(const Call& c, int64_t M, int64_t g0, int64_t g1) {
  // Two sets of buffers, alternating: overwriting words that tile loads still in flight read stalls
  // every store (the stores wait for the tile unit), so a pair unpacks into the set the pair before
  // last used.
  thread_local std::vector<uint16_t> buffers[4];
  for (auto& buf : buffers) buf.resize(c.nblocks * BLOCK_WORDS);
  thread_local std::vector<float> products;  // [nblocks][2][rows][16], 64-byte aligned rows
  products.resize(c.nblocks * 2 * MAX_ROWS * GROUP + 16);
  float* t = products.data() + (16 - (reinterpret_cast<uintptr_t>(products.data()) / 4) % 16) % 16;
  const int64_t block_bytes = Q4 ? 256 : 512;
  int configured = -1;  // tile shapes are per thread; load them in every chunk
  // Rows in slices that keep their activation pieces in L2 (3 x 128 rows x 1536 x 2 bytes = 1.2 MB):
  // past that every group read them from L3 again, and 256 rows cost 3.7x 128. The weights are
  // unpacked again for each slice (a few percent of its products).
  for (int64_t m0 = 0; m0 < M; m0 += ROW_SLICE)
  for (int64_t g = g0, pair = 0; g < g1; g += 2, ++pair) {
    const int groups = static_cast<int>(std::min<int64_t>(2, g1 - g));
    uint16_t* unpacked[2] = {buffers[2 * (pair & 1)].data(), buffers[2 * (pair & 1) + 1].data()};
    for (int p = 0; p < groups; ++p) {
      const uint8_t* src = c.w + (g + p) * c.nblocks * block_bytes;
      // The group two ahead (the next pair's), a block's worth at a time: with few rows a call is
      // bound by memory, and the hardware prefetcher alone left the unpacking waiting on it (all
      // layers + head at 16 rows: 19.9 ms without, 16.1 ms with).
      const bool ahead = g + p + 2 < g1;
      const uint8_t* next = src + 2 * c.nblocks * block_bytes;
      const float* next_d = c.d + (g + p + 2) * c.nblocks * GROUP;
      const float* next_m = Q4 ? c.m + (g + p + 2) * c.nblocks * GROUP : nullptr;
      for (int64_t b = 0; b < c.nblocks; ++b) {
        if (ahead) {
          block::prefetch_lines(next + b * block_bytes, block_bytes);
          block::prefetch_lines(next_d + b * GROUP, GROUP * 4);
          if (Q4) block::prefetch_lines(next_m + b * GROUP, GROUP * 4);
        }
        if (Q4) unpack_q4(src + b * block_bytes, unpacked[p] + b * BLOCK_WORDS);
        else unpack_q8(reinterpret_cast<const int8_t*>(src) + b * block_bytes, unpacked[p] + b * BLOCK_WORDS);
      }
    }
    for (int64_t r0 = m0; r0 < std::min(M, m0 + ROW_SLICE); r0 += MAX_ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - r0));
      if (rows != configured) configure_tiles(configured = rows);
      row_tile_n<Q4>(rows, groups, c, r0, g, unpacked, t);
    }
  }
  _tile_release();
}

// x [M, K] f32 -> three bf16 pieces [M, K] with x = hi + mid + lo exactly (each a truncation of
// what is left), and, for Q4, xsum [M, nblocks] (block sums of x for the min term, one fixed order).
void split_activations(const float* x, int64_t M, int64_t K, uint16_t* hi, uint16_t* mid, uint16_t* lo,
                       float* xsum) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t i = 0; i < M * K; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
    const __m512 r1 = _mm512_sub_ps(v, h);
    const __m512 mi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), top));
    const __m512 r2 = _mm512_sub_ps(r1, mi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(h), 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(mi), 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r2), 16)));
    if (xsum && i % QK == 16)
      xsum[i / QK] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + i - 16), v));
  }
}

}  // namespace

bool cpu_has_amx() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return false;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool tile = d & (1u << 24), bf16_tiles = d & (1u << 22);
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    const bool avx512_bf16 = a & (1u << 5);
    if (!tile || !bf16_tiles || !avx512_bf16) return false;
    // Linux hands out the tile registers' state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

}  // namespace amx

std::vector<at::Tensor> block_pack_amx(at::Tensor qs, at::Tensor scales, at::Tensor mins, bool is_q4) {
  // qs [N, K/2] u8 (Q4) or [N, K] i8 (Q8); scales, mins [N, K/32] f32
  //   -> packed [N/16, K/32, 256 | 512] u8, scales and mins [N/16, K/32, 16] f32
  const int64_t N = qs.size(0), nb = scales.size(1), row_bytes = qs.size(1);
  TORCH_CHECK(N % amx::GROUP == 0, "AMX packing needs a multiple of 16 output columns");
  const int64_t G = N / amx::GROUP, block_bytes = is_q4 ? 256 : 512;
  auto packed = at::zeros({G, nb, block_bytes}, at::kByte);
  const uint8_t* q = qs.contiguous().data_ptr<uint8_t>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  for (int64_t g = 0; g < G; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = out + (g * nb + b) * block_bytes;
      // The 4-bit value (or int8 byte) of column n, element k of block b.
      auto value = [&](int word) -> uint8_t {
        const int kp = word >> 5, n = (word & 31) >> 1, k = 2 * kp + (word & 1);
        const uint8_t* col = q + (g * amx::GROUP + n) * row_bytes;
        if (!is_q4) return col[b * QK + k];
        const uint8_t byte = col[b * (QK / 2) + (k & 15)];
        return k < 16 ? (byte & 0x0F) : (byte >> 4);
      };
      if (is_q4) {
        for (int c = 0; c < 4; ++c)
          for (int h = 0; h < 2; ++h)
            for (int p = 0; p < 64; ++p) dst[c * 64 + p] |= value(amx::q4_word(c, h, p)) << (4 * h);
      } else {
        for (int w = 0; w < amx::BLOCK_WORDS; ++w) dst[w] = value(w);
      }
    }
  // [N, nb] -> [G, nb, 16]: a group's 16 scales per block side by side
  auto regroup = [&](const at::Tensor& t) {
    return t.reshape({G, amx::GROUP, nb}).transpose(1, 2).contiguous();
  };
  return {packed, regroup(scales), is_q4 ? regroup(mins) : at::empty({0}, scales.options())};
}

at::Tensor block_matmul_amx(at::Tensor x, at::Tensor packed, at::Tensor scales, at::Tensor mins,
                            bool is_q4) {
  // x [M, K] f32, weights as block_pack_amx returns them -> y [M, N] f32
  TORCH_CHECK(amx::cpu_has_amx(), "this CPU (or kernel) gives no AMX tiles");
  TORCH_CHECK(x.dtype() == at::kFloat && x.is_contiguous() && x.dim() == 2, "x must be contiguous f32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), G = packed.size(0), nb = packed.size(1), N = G * amx::GROUP;
  TORCH_CHECK(K == nb * QK, "x has ", K, " columns, the weights ", nb * QK);
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  auto pieces = at::empty({3, M, K}, at::kShort);
  auto xsum = is_q4 ? at::empty({M, nb}, x.options()) : at::Tensor();
  uint16_t* p = reinterpret_cast<uint16_t*>(pieces.data_ptr<int16_t>());
  amx::split_activations(x.data_ptr<float>(), M, K, p, p + M * K, p + 2 * M * K,
                         is_q4 ? xsum.data_ptr<float>() : nullptr);
  amx::Call c{packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), is_q4 ? mins.data_ptr<float>() : nullptr,
              {p, p + M * K, p + 2 * M * K}, is_q4 ? xsum.data_ptr<float>() : nullptr, y.data_ptr<float>(),
              N, K, nb};
  const int64_t grain = std::max<int64_t>(1, G / (4 * at::get_num_threads()));
  at::parallel_for(0, G, grain, [&](int64_t g0, int64_t g1) {
    if (is_q4) amx::run_groups<true>(c, M, g0, g1);
    else amx::run_groups<false>(c, M, g0, g1);
  });
  return y;
}

bool block_kernel_amx() { return amx::cpu_has_amx(); }

}  // namespace specserve

#undef T_OUT
#undef T_HI
#undef T_MID
#undef T_LO
#undef T_W
#undef T_OUT2
#undef T_W2
#pragma GCC pop_options
