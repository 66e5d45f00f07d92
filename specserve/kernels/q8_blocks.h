// Int8 activations (issue 37): GGUF blocks dotted with 8-bit activations, as llama.cpp does.
//
// A row of x is quantised per 32 values (llama.cpp's Q8_0 rule, with an fp32 scale): d = absmax / 127,
// q = round(x / d). Every weight type is read as sub-blocks of G unsigned integers u (G = 32; Q6_K's
// scales cover 16) with w = ws (u - off) + wm, so one output is, over the sub-blocks s in order,
//
//   isum_s = sum_e u_e q_e - off * sum_e q_e            (exact, int32)
//   y      = fma(float(isum_s), ws_s * d_s, y)          (ws_s * d_s rounded once)
//   y      = fma(wm_s, d_s * sum_e q_e, y)              (types with a min: Q4_1, Q5_1, Q4_K)
//
// summed in that one order whatever the number of rows beside it: a verify pass gives the bits of
// one-token steps within the mode. q8_reference (q8_matmul.cpp) is this formula over the file's blocks;
// the VNNI build (q8_matmul_avx512.cpp) runs it over a copy regrouped by q8_pack, 16 output columns
// a group (one per 32-bit lane), with exactly the file's bytes per block; the AVX2 and AMX builds read
// the same copy.
#pragma once
#include "gguf_blocks.h"

#include <type_traits>

namespace specserve {
namespace q8 {

using namespace gguf;

constexpr int LANES = 16;  // output columns per packed group

constexpr int sub_size(int t) { return t == Q6_K ? 16 : 32; }
constexpr int offset(int t) {
  switch (t) {
    case Q4_0: return 8;
    case Q5_0: return 16;
    case Q8_0: return 128;
    case Q6_K: return 32;
    default: return 0;
  }
}
constexpr bool has_min(int t) { return t == Q4_1 || t == Q5_1 || t == Q4_K; }

// Sub-block s of one file block: its G values u (unsigned) and (ws, wm), so that the weight's exact
// fp32 value is ws (u - off) + wm (decode_block's value; ws and wm are exact products).
inline void sub_block(int t, const uint8_t* b, int s, uint8_t* u, float* ws, float* wm) {
  *wm = 0.0f;
  switch (t) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
      const bool five = t == Q5_0 || t == Q5_1, mn = t == Q4_1 || t == Q5_1;
      *ws = fp16(b);
      if (mn) *wm = fp16(b + 2);
      uint32_t qh = 0;
      if (five) std::memcpy(&qh, b + (mn ? 4 : 2), 4);
      const uint8_t* qs = b + (mn ? 4 : 2) + (five ? 4 : 0);
      for (int j = 0; j < 16; ++j) {
        u[j] = (qs[j] & 0xF) | (five ? ((qh >> j) & 1) << 4 : 0);
        u[j + 16] = (qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0);
      }
      break;
    }
    case Q8_0:
      *ws = fp16(b);
      for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(b[2 + j] ^ 0x80);  // w + 128
      break;
    case Q4_K: {
      int sc, m;
      k4_scale_min(s, b + 4, &sc, &m);
      *ws = fp16(b) * sc;
      *wm = -(fp16(b + 2) * m);
      const uint8_t* q = b + 16 + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) u[l] = s % 2 ? q[l] >> 4 : q[l] & 0xF;
      break;
    }
    case Q6_K: {
      // element 128 h + 32 k + l (l < 32) of the block is in sub-block 8 h + 2 k + l / 16
      const int h = s / 8, k = (s % 8) / 2, l0 = 16 * (s % 2);
      const uint8_t* ql = b + 64 * h + 32 * (k % 2);
      const uint8_t* qh = b + 128 + 32 * h;
      *ws = fp16(b + 208) * reinterpret_cast<const int8_t*>(b + 192)[s];
      for (int i = 0; i < 16; ++i) {
        const int l = l0 + i;
        u[i] = ((k < 2 ? ql[l] & 0xF : ql[l] >> 4)) | (((qh[l] >> (2 * k)) & 3) << 4);
      }
      break;
    }
    default:
      break;
  }
}

// Row r of x [M, K] quantised: q [K] int8, d [K/32] (scale per 32), s16 [K/16] (sums of q per 16),
// xs [K/32] (d times the sum of q per 32: the min term's activation).
struct RowOut {  // where quantize_row writes one row
  int8_t* q;
  float* d;
  int32_t* s16;
  float* xs;
  // block b's scale and its two sums of q per 16
  void sums(int64_t b, float db, int32_t s0, int32_t s1) const {
    d[b] = db;
    s16[2 * b] = s0;
    s16[2 * b + 1] = s1;
    xs[b] = db * static_cast<float>(s0 + s1);
  }
};

inline void quantize_row(const float* x, int64_t K, const RowOut& o) {
  for (int64_t b = 0; b < K / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
    const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    int32_t s[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(x[32 * b + j] * id));
      o.q[32 * b + j] = static_cast<int8_t>(v);
      s[j / 16] += v;
    }
    o.sums(b, db, s[0], s[1]);
  }
}

// quantize_row 8 lanes at a time, for the fast builds: the same IEEE steps (the max of |x| with NaNs
// passed over as std::max does, one division, one reciprocal, a product rounded to nearest even, the
// low byte kept), so the same bits. The scalar loop cost a fifth of a 16-row product.
inline void quantize_row_avx2(const float* x, int64_t K, const RowOut& o) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  auto hsum = [](__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1)));
  };
  for (int64_t b = 0; b < K / 32; ++b) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);  // a NaN in |x| leaves m as it was
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float db = _mm_cvtss_f32(h) / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) {
      qi[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      const __m256i lo = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(qi[i], low_bytes), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o.q + 32 * b + 8 * i), _mm256_castsi256_si128(lo));
    }
    o.sums(b, db, hsum(_mm256_add_epi32(qi[0], qi[1])), hsum(_mm256_add_epi32(qi[2], qi[3])));
  }
}

// x quantised, row by row (quantize_row), in the buffers of one call.
struct Acts {
  const int8_t* q;
  const float* d;
  const int32_t* s16;
  const float* xs;
  int64_t K;
  const int8_t* qr(int64_t r) const { return q + r * K; }
  const float* dr(int64_t r) const { return d + r * (K / 32); }
  const int32_t* sr(int64_t r) const { return s16 + r * (K / 16); }
  const float* xsr(int64_t r) const { return xs + r * (K / 32); }
};

// One packed segment: groups of 16 output columns, each a run of K / block_elems packed blocks of
// 16 * block_bytes bytes (q8_pack's layout).
struct PSeg {
  const uint8_t* data;
  int type;
  int64_t rows, first;  // first: this segment's first output column in the call
};

struct PCall {
  const PSeg* segs;
  int nsegs;
  Acts a;
  float* y;  // [M, N]
  int64_t M, K, N;
};

// f(std::integral_constant<int, T>{}) for the segment's type T: each build's run_type<T>, picked once.
template <class F>
inline void by_type(int t, F&& f) {
  switch (t) {
    case Q4_0: return f(std::integral_constant<int, Q4_0>{});
    case Q4_1: return f(std::integral_constant<int, Q4_1>{});
    case Q5_0: return f(std::integral_constant<int, Q5_0>{});
    case Q5_1: return f(std::integral_constant<int, Q5_1>{});
    case Q8_0: return f(std::integral_constant<int, Q8_0>{});
    case Q4_K: return f(std::integral_constant<int, Q4_K>{});
    case Q6_K: return f(std::integral_constant<int, Q6_K>{});
    default: return;
  }
}

// The builds over groups g0 .. g1-1 of segment i: AVX-512 VNNI (q8_matmul_avx512.cpp), AVX2
// (q8_matmul_avx2.cpp), AVX-VNNI (q8_matmul_avxvnni.cpp) and the same with VPDPBUSD emulated, AMX-INT8
// tiles (q8_matmul_amx.cpp) and the same with the tile unit in software.
void run_vnni(const PCall& c, int seg, int64_t g0, int64_t g1);
void run_avx2(const PCall& c, int seg, int64_t g0, int64_t g1);
void run_avxvnni(const PCall& c, int seg, int64_t g0, int64_t g1);
void run_avxvnni_emulated(const PCall& c, int seg, int64_t g0, int64_t g1);
void run_amx(const PCall& c, int seg, int64_t g0, int64_t g1);
void run_amx_emulated(const PCall& c, int seg, int64_t g0, int64_t g1);
bool cpu_has_vnni();
bool cpu_has_avxvnni();  // VEX-encoded VPDPBUSD on 256-bit vectors
bool cpu_has_avx512();    // F, BW, DQ, VL: what the emulated tile build needs
bool cpu_has_amx_int8();  // AMX-TILE and AMX-INT8, with the OS's leave to use them

}  // namespace q8
}  // namespace specserve
