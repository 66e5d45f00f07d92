// The int8-activation build on Intel AMX-INT8 tiles (Sapphire Rapids and later), over the weights
// q8_pack regrouped for the VNNI build: no copy of its own, so it costs no memory.
//
// Why: the VNNI build pays one VPDPBUSD (64 multiply-adds) per 4 weights of 16 columns per row, so past
// a few rows a pass is compute-bound and every further verify row or sequence costs about as much as
// the first (bench/ceiling.py, docs/decisions.md#batch-ceiling). One TDPBSUD multiplies a [rows x G]
// tile of activations by a [G x 16] tile of weights: 16 x 16 x 32 multiply-adds.
//
// Numerics: the weights are unpacked as signed bytes u - off (every type's fits: -128 .. 127), and the
// tile unit sums int8 x int8 products into int32 exactly, so a sub-block's product is the isum of
// q8_blocks.h (sum u q - off sum q) whatever the order inside the unit; every float step after it is
// the VNNI build's, in its order. So this build gives q8_reference's bits, as the others do, and a row's
// bits do not depend on the rows beside it or on which build ran the pass.
//
// How: per pair of 16-column groups, each group's blocks are unpacked once (AVX-512, the way run_vnni
// reads them) into the tile unit's B layout, one [G/4 x 64 bytes] tile per sub-block, with the
// sub-blocks' float scales beside them; then, per tile of up to 16 rows, a chunk of sub-blocks' tile
// products is stored as int32 and scaled into each row's sums (as the bf16 build does: loads right
// after a tile store wait for the products, so scaling each sub-block at once would stall). Which row
// count makes this faster than VNNI, and the chunk and slice sizes, are unmeasured: no AMX CPU was at
// hand when it was written (docs/decisions.md#amx-int8).
//
// The same code runs with the tile unit in software (Emu below, build "amx-emulated"), so the
// unpacking, the tile shapes and the scaling are tested against q8_reference on any AVX-512 CPU; only
// the five tile instructions differ, and Emu implements their documented semantics, faults included.
// bench/q8_harness/run.sh times the build, and (on any AVX-512 CPU) its AVX-512 work alone.
#include "ops.h"
#include "q8_blocks.h"

#include <cstdio>
#include <sys/syscall.h>
#include <unistd.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-int8")

#include "q8_avx512.h"

namespace specserve {
namespace q8 {
namespace {

constexpr int MAX_ROWS = 16;        // activation rows per tile
constexpr int64_t ROW_SLICE = 64;   // rows per unpacking of a group pair (their activations stay in L2)
constexpr int64_t CHUNK = 64;       // sub-blocks per round of tile products, then scaling
// Tiles: 0 the activations, 1 and 2 the two groups' weights, 3 and 4 their int32 products.

struct alignas(64) Config {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile shapes for `rows` activation rows and sub-blocks of G values.
Config shapes(int rows, int G) {
  Config c;
  c.rows[0] = rows;
  c.colsb[0] = G;  // A: each row's G int8 activations
  for (int t : {1, 2}) {
    c.rows[t] = G / 4;  // B: row k holds elements 4k .. 4k+3 of each of 16 columns
    c.colsb[t] = 64;
  }
  for (int t : {3, 4}) {
    c.rows[t] = rows;  // C: rows x 16 int32
    c.colsb[t] = 64;
  }
  return c;
}

// The tile unit.
struct Hw {
  static void configure(const Config& c) { _tile_loadconfig(&c); }
  static void release() { _tile_release(); }
  // (GCC's tile intrinsics paste the tile number into the instruction, hence the literal numbers. Its
  // TILELOADD asm names no memory, so a compiler barrier first keeps the unpacking's stores before it.)
  template <int T>
  static void load(const void* p, int64_t stride) {
    asm volatile("" ::: "memory");
    if constexpr (T == 0) _tile_loadd(0, p, stride);
    else if constexpr (T == 1) _tile_loadd(1, p, stride);
    else _tile_loadd(2, p, stride);
  }
  template <int T>
  static void zero() {
    if constexpr (T == 3) _tile_zero(3);
    else _tile_zero(4);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    if constexpr (T == 3) _tile_stored(3, p, stride);
    else _tile_stored(4, p, stride);
  }
  template <int C, int B>  // C += tile 0 . B (int8 both)
  static void dpbssd() {
    if constexpr (C == 3) _tile_dpbssd(3, 0, 1);
    else _tile_dpbssd(4, 0, 2);
  }
};

// The tile unit in software, per thread like the real one's state: what Intel's manual says the five
// instructions do, and the shape checks that make TDPBSSD fault (#UD) there, as an abort here.
struct Emu {
  struct Unit {
    Config cfg;
    bool on = false;
    alignas(64) uint8_t tile[8][1024];
  };
  static Unit& unit() {
    thread_local Unit u;
    return u;
  }
  [[noreturn]] static void fault(const char* what) {
    std::fprintf(stderr, "specserve: emulated AMX: %s\n", what);
    std::abort();
  }
  static int rows(int t) { return unit().cfg.rows[t]; }
  static int colsb(int t) { return unit().cfg.colsb[t]; }
  static void check(int t) {
    if (!unit().on) fault("a tile used before LDTILECFG");
    if (rows(t) < 1 || rows(t) > 16 || colsb(t) < 1 || colsb(t) > 64) fault("a tile used that its configuration leaves out");
  }
  static void configure(const Config& c) {
    if (c.palette_id != 1) fault("palette 1 is the one with tiles");
    unit().cfg = c;
    unit().on = true;
    std::memset(unit().tile, 0, sizeof(unit().tile));  // LDTILECFG zeroes the tiles
  }
  static void release() { unit().on = false; }
  template <int T>
  static void load(const void* p, int64_t stride) {
    check(T);
    for (int r = 0; r < rows(T); ++r) std::memcpy(unit().tile[T] + 64 * r, static_cast<const uint8_t*>(p) + r * stride, colsb(T));
  }
  template <int T>
  static void zero() {
    check(T);
    std::memset(unit().tile[T], 0, 1024);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    check(T);
    for (int r = 0; r < rows(T); ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, unit().tile[T] + 64 * r, colsb(T));
  }
  template <int C, int B>
  static void dpbssd() {
    constexpr int A = 0;
    check(C), check(A), check(B);
    if (colsb(C) != colsb(B) || rows(C) != rows(A) || colsb(A) != 4 * rows(B) || colsb(A) % 4 || colsb(C) % 4)
      fault("TDPBSSD's tile shapes do not agree (#UD)");
    const uint8_t *a = unit().tile[A], *b = unit().tile[B];
    for (int m = 0; m < rows(C); ++m)
      for (int n = 0; n < colsb(C) / 4; ++n) {
        uint32_t acc;  // sums wrap around, as the unit's do
        std::memcpy(&acc, unit().tile[C] + 64 * m + 4 * n, 4);
        for (int k = 0; k < rows(B); ++k)
          for (int i = 0; i < 4; ++i)
            acc += static_cast<uint32_t>(static_cast<int8_t>(a[64 * m + 4 * k + i]) * static_cast<int8_t>(b[64 * k + 4 * n + i]));
        std::memcpy(unit().tile[C] + 64 * m + 4 * n, &acc, 4);
      }
  }
};

using packed::halfs;
using packed::load;

// One packed block of 16 columns (q8_pack's layout, decoded as run_vnni decodes it) -> for each of its
// sub-blocks s: G * 16 bytes u - off at w + s G 16 in B layout (row k: the 4-byte lane of each column
// that run_vnni's k-th VPDPBUSD of the sub-block takes), and its 16 column scales ws[16 s ..] (and wm).
template <int T>
inline void unpack(const uint8_t* p, uint8_t* w, float* ws, float* wm) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), off = _mm512_set1_epi8(static_cast<char>(offset(T)));
  auto put = [&](int64_t at, __m512i u) { _mm512_storeu_si512(w + at, offset(T) ? _mm512_sub_epi8(u, off) : u); };
  if constexpr (T == Q4_K) {  // 8 sub-blocks of 32
    const __m512 d = halfs(p), dmin = halfs(p + 32);
    const packed::K4Scales k4(p + 64);
    const uint8_t* qs = p + 256;
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 8; ++k) {  // low nibbles: sub-block 2j, high: 2j + 1
        const __m512i v = load(qs + 64 * (8 * j + k));
        put(512 * (2 * j) + 64 * k, _mm512_and_si512(v, low4));
        put(512 * (2 * j + 1) + 64 * k, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
      }
    for (int s = 0; s < 8; ++s) {
      _mm512_storeu_ps(ws + 16 * s, k4.scale(d, s));
      _mm512_storeu_ps(wm + 16 * s, k4.min(dmin, s));
    }
  } else if constexpr (T == Q6_K) {  // 16 sub-blocks of 16
    const __m512 d = halfs(p);
    const uint8_t* sc = p + 32;
    const uint8_t* lo = p + 32 + 256;
    const uint8_t* hb = lo + 32 * 64;
    for (int s = 0; s < 16; ++s) {
      __m512i v[4];
      packed::q6_vectors(lo, hb, s, v);
      for (int k = 0; k < 4; ++k) put(256 * s + 64 * k, v[k]);
      _mm512_storeu_ps(ws + 16 * s, packed::q6_scale(d, sc, s));
    }
  } else if constexpr (T == Q8_0) {
    for (int k = 0; k < 8; ++k) put(64 * k, load(p + 32 + 64 * k));
    _mm512_storeu_ps(ws, halfs(p));
  } else {  // Q4_0 / Q4_1 / Q5_0 / Q5_1: low nibbles elements 0..15, high 16..31
    constexpr bool five = T == Q5_0 || T == Q5_1, mn = T == Q4_1 || T == Q5_1;
    const uint8_t* masks = p + (mn ? 64 : 32);
    const uint8_t* v = masks + (five ? 64 : 0);
    for (int k = 0; k < 4; ++k) {
      __m512i lo, hi;
      packed::q45_vectors<five>(masks, v, k, &lo, &hi);
      put(64 * k, lo);
      put(256 + 64 * k, hi);
    }
    _mm512_storeu_ps(ws, halfs(p));
    if constexpr (mn) _mm512_storeu_ps(wm, halfs(p + 32));
  }
}

// t[(s - s0) P + p] [rows][16] = the products of sub-blocks s0 .. s1-1 of the tile's rows (activations
// from a, a row every `stride` bytes) with group p's unpacked u[p].
template <class U, int P>
void products(const int8_t* a, int64_t stride, uint8_t* const* u, int G, int64_t s0, int64_t s1, int32_t* t, int rows) {
  for (int64_t s = s0; s < s1; ++s) {
    U::template load<0>(a + s * G, stride);
    U::template zero<3>();
    U::template load<1>(u[0] + s * G * 16, 64);
    U::template dpbssd<3, 1>();
    if constexpr (P == 2) {
      U::template zero<4>();
      U::template load<2>(u[1] + s * G * 16, 64);
      U::template dpbssd<4, 2>();
    }
    U::template store<3>(t + (s - s0) * P * rows * LANES, 64);
    if constexpr (P == 2) U::template store<4>(t + ((s - s0) * P + 1) * rows * LANES, 64);
  }
}

// acc[r] of rows r0 .. r0+R-1 (one group p of P): the products (isum) of sub-blocks s0 .. s1-1 scaled
// as q8_blocks.h says, in its order.
template <int R, int G, bool MIN>
void scale(const int32_t* t, int P, int p, const float* ws, const float* wm, int64_t s0, int64_t s1, const Acts& a,
           int64_t r0, __m512* acc) {
  __m512 y[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) y[r] = acc[r];
  for (int64_t s = s0; s < s1; ++s) {
    const int32_t* ts = t + ((s - s0) * P + p) * R * LANES;
    const int64_t e0 = s * G;
    const __m512 w = _mm512_loadu_ps(ws + 16 * s);
    const __m512 m = MIN ? _mm512_loadu_ps(wm + 16 * s) : w;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const __m512i isum = _mm512_loadu_si512(ts + r * LANES);
      y[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(w, _mm512_set1_ps(a.dr(row)[e0 / 32])), y[r]);
      if constexpr (MIN) y[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.xsr(row)[e0 / 32]), y[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = y[r];
}

template <int G, bool MIN, int R = MAX_ROWS>
void scale_rows(int rows, const int32_t* t, int P, int p, const float* ws, const float* wm, int64_t s0, int64_t s1,
                const Acts& a, int64_t r0, __m512* acc) {
  if constexpr (R > 1) {
    if (rows < R) return scale_rows<G, MIN, R - 1>(rows, t, P, p, ws, wm, s0, s1, a, r0, acc);
  }
  scale<R, G, MIN>(t, P, p, ws, wm, s0, s1, a, r0, acc);
}

// A thread's buffers, 64-byte aligned and grown as needed.
template <class V>
V* grow(std::vector<V>& buf, int64_t n) {
  buf.resize(n + 64 / sizeof(V));
  const uintptr_t at = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + (64 - at % 64) % 64 / sizeof(V);
}

// Groups g0 .. g1-1 of segment s, every row: two groups at a time, sharing each activation tile.
template <class U, int T>
void run_type(const PCall& c, const PSeg& s, int64_t g0, int64_t g1) {
  constexpr int G = sub_size(T), NS = block_elems(T) / G;
  constexpr bool MIN = has_min(T);
  const int64_t nb = c.K / block_elems(T), nsub = nb * NS, pbytes = LANES * block_bytes(T);
  // Two sets of unpacked pairs, alternating: stores into words that tile loads still in flight read
  // wait for the tile unit (the bf16 build measured this).
  thread_local std::vector<uint8_t> ubuf[4];
  thread_local std::vector<float> wsbuf[4], wmbuf[4];
  thread_local std::vector<int32_t> tbuf;
  uint8_t* u[4];
  float *ws[4], *wm[4];
  for (int i = 0; i < 4; ++i) {
    u[i] = grow(ubuf[i], nsub * G * LANES);
    ws[i] = grow(wsbuf[i], nsub * LANES);
    wm[i] = grow(wmbuf[i], nsub * LANES);
  }
  int32_t* t = grow(tbuf, CHUNK * 2 * MAX_ROWS * LANES);
  int configured = -1;
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_SLICE)
    for (int64_t g = g0, pair = 0; g < g1; g += 2, ++pair) {
      const int P = static_cast<int>(std::min<int64_t>(2, g1 - g));
      const int set = 2 * (pair & 1);
      for (int q = 0; q < P; ++q) {
        const uint8_t* src = s.data + (g + q) * nb * pbytes;
        const uint8_t* next = src + 2 * nb * pbytes;  // the next pair's group (groups lie one after another)
        const bool ahead = g + q + 2 < g1;
        for (int64_t b = 0; b < nb; ++b) {
          if (ahead)
            for (int64_t off = 0; off < pbytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(next + b * pbytes + off), _MM_HINT_T0);
          unpack<T>(src + b * pbytes, u[set + q] + b * NS * G * LANES, ws[set + q] + b * NS * LANES, wm[set + q] + b * NS * LANES);
        }
      }
      for (int64_t r0 = m0; r0 < std::min(c.M, m0 + ROW_SLICE); r0 += MAX_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, c.M - r0));
        if (rows != configured) U::configure(shapes(configured = rows, G));
        __m512 acc[2][MAX_ROWS];
        for (auto& pa : acc)
          for (auto& v : pa) v = _mm512_setzero_ps();
        for (int64_t s0 = 0; s0 < nsub; s0 += CHUNK) {
          const int64_t s1 = std::min(nsub, s0 + CHUNK);
          if (P == 2) products<U, 2>(c.a.qr(r0), c.K, u + set, G, s0, s1, t, rows);
          else products<U, 1>(c.a.qr(r0), c.K, u + set, G, s0, s1, t, rows);
          for (int q = 0; q < P; ++q)
            scale_rows<G, MIN>(rows, t, P, q, ws[set + q], wm[set + q], s0, s1, c.a, r0, acc[q]);
        }
        for (int q = 0; q < P; ++q) {
          const int64_t col = s.first + (g + q) * LANES, valid = std::min<int64_t>(LANES, s.rows - (g + q) * LANES);
          const __mmask16 keep = valid == LANES ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
          for (int r = 0; r < rows; ++r) _mm512_mask_storeu_ps(c.y + (r0 + r) * c.N + col, keep, acc[q][r]);
        }
      }
    }
  if (configured >= 0) U::release();
}

template <class U>
void run(const PCall& c, int seg, int64_t g0, int64_t g1) {
  const PSeg& s = c.segs[seg];
  by_type(s.type, [&](auto t) { run_type<U, decltype(t)::value>(c, s, g0, g1); });
}

}  // namespace

void run_amx(const PCall& c, int seg, int64_t g0, int64_t g1) { run<Hw>(c, seg, g0, g1); }
void run_amx_emulated(const PCall& c, int seg, int64_t g0, int64_t g1) { run<Emu>(c, seg, g0, g1); }

}  // namespace q8
}  // namespace specserve

#pragma GCC pop_options

namespace specserve {
namespace q8 {

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

bool cpu_has_amx_int8() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!cpu_has_avx512()) return false;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;  // AMX-TILE, AMX-INT8
    // Linux hands out the tile registers' state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

}  // namespace q8
}  // namespace specserve
