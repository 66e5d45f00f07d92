// GGUF's own block formats, read where they lie (the mmap'd file), for gguf_matmul*.cpp.
//
// Layouts follow ggml-common.h. Every decoder gives the exact fp32 value of each weight, the one
// numpy's dequantisation gives (loading/quants.py): each is a small integer times an fp16 scale (and
// a min), and those products need at most 23 significant bits, so they are exact in fp32; only the
// min's subtraction rounds, once, as it does in the reference.
#pragma once
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace specserve {
namespace gguf {

// ggml's type ids (the values GGUF files store).
enum Type : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q6_K = 14
};

// An fp16 scale stored little-endian, widened exactly (F16C: the extension is built with -mf16c).
inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Bit j of the 32 bits -> byte j all ones (llama.cpp's bytes_from_bits_32): Q5's fifth bits.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
}

// Elements and bytes per block of each type (0 for a type the kernels do not take).
constexpr int block_elems(int t) {
  switch (t) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return 32;
    case Q4_K: case Q6_K: return 256;
    default: return 0;
  }
}

constexpr int block_bytes(int t) {
  switch (t) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q6_K: return 210;
    default: return 0;
  }
}

// Q4_K's 12 bytes of 6-bit (scale, min) pairs, sub-block j of 8 (ggml's get_scale_min_k4).
inline void k4_scale_min(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// All 8 (scale, min) pairs of a Q4_K block at once (llama.cpp's utmp shuffle, the kernels' way):
// bytes 0..7 of u are the 8 scales, bytes 8..15 the 8 mins, as k4_scale_min gives them one by one.
inline void k4_scales_mins(const uint8_t* q, uint32_t u[4]) {
  std::memcpy(u, q, 12);
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t mins_lo = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = mins_lo;
  u[0] &= kmask1;
}

// One block -> its block_elems(T) fp32 values (the reference decoder; the AVX-512 build decodes
// the same values in registers). A template, so that each type's loops vectorise.
template <int t>
inline void decode_block_t(const uint8_t* b, float* y) {
  switch (t) {
    case Q4_0: case Q4_1: {
      const float d = fp16(b), m = t == Q4_1 ? fp16(b + 2) : 0.0f;
      const int off = t == Q4_1 ? 0 : -8;
      const uint8_t* qs = b + (t == Q4_1 ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        y[j] = d * ((qs[j] & 0xF) + off) + m;
        y[j + 16] = d * ((qs[j] >> 4) + off) + m;
      }
      break;
    }
    case Q5_0: case Q5_1: {
      const float d = fp16(b), m = t == Q5_1 ? fp16(b + 2) : 0.0f;
      const uint8_t* p = b + (t == Q5_1 ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, p, 4);
      const uint8_t* qs = p + 4;
      for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
        const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = t == Q5_0 ? d * (x0 - 16) : d * x0 + m;
        y[j + 16] = t == Q5_0 ? d * (x1 - 16) : d * x1 + m;
      }
      break;
    }
    case Q8_0: {
      const float d = fp16(b);
      const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
      for (int j = 0; j < 32; ++j) y[j] = d * qs[j];
      break;
    }
    case Q4_K: {
      const float d = fp16(b), dmin = fp16(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* q = b + 16;
      for (int j = 0; j < 4; ++j) {
        int sc1, m1, sc2, m2;
        k4_scale_min(2 * j, scales, &sc1, &m1);
        k4_scale_min(2 * j + 1, scales, &sc2, &m2);
        const float d1 = d * sc1, mm1 = dmin * m1, d2 = d * sc2, mm2 = dmin * m2;
        for (int l = 0; l < 32; ++l) {
          y[64 * j + l] = d1 * (q[32 * j + l] & 0xF) - mm1;
          y[64 * j + 32 + l] = d2 * (q[32 * j + l] >> 4) - mm2;
        }
      }
      break;
    }
    case Q6_K: {
      const float d = fp16(b + 208);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b + 64 * h;
        const uint8_t* qh = b + 128 + 32 * h;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
        float* o = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          o[l] = (d * sc[is]) * q1;
          o[l + 32] = (d * sc[is + 2]) * q2;
          o[l + 64] = (d * sc[is + 4]) * q3;
          o[l + 96] = (d * sc[is + 6]) * q4;
        }
      }
      break;
    }
    default:
      break;
  }
}

inline void decode_block(int t, const uint8_t* b, float* y) {
  switch (t) {
    case Q4_0: return decode_block_t<Q4_0>(b, y);
    case Q4_1: return decode_block_t<Q4_1>(b, y);
    case Q5_0: return decode_block_t<Q5_0>(b, y);
    case Q5_1: return decode_block_t<Q5_1>(b, y);
    case Q8_0: return decode_block_t<Q8_0>(b, y);
    case Q4_K: return decode_block_t<Q4_K>(b, y);
    case Q6_K: return decode_block_t<Q6_K>(b, y);
    default: return;
  }
}

// One call's weight: segments of output rows, each in its own type (q, k and v of one layer may
// differ: Q4_K_M files keep some v and down projections in Q6_K). Rows of a segment are contiguous
// blocks, row_bytes apart.
struct Segment {
  const uint8_t* data;
  int type;
  int64_t rows, row_bytes, first;  // first: this segment's first output column in the call
};

struct Call {
  const Segment* segs;
  int nsegs;
  const float* x;  // [M, K]
  float* y;        // [M, N]
  int64_t M, K, N;
};

// The two builds over output columns n0 .. n1-1 of every segment (gguf_matmul.cpp: AVX2;
// gguf_matmul_avx512.cpp: AVX-512, used where the CPU has it).
void run_avx2(const Call& c, int64_t n0, int64_t n1);
void run_avx512(const Call& c, int64_t n0, int64_t n1);

}  // namespace gguf
}  // namespace specserve
