// y = x @ W^T with W in GGUF's own blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K), read where
// they lie: the tensors are views of the mmap'd model file, so a model costs its file's bytes and no
// copy. x and y are float32.
//
// As in block_matmul.cpp, the weights are never rounded: each block decodes to its exact fp32 values
// (gguf_blocks.h), and every output y[r, n] is summed in one fixed order (per chunk of 32 weights a
// partial dot product, added to one accumulator in block order, then one fixed reduction), whatever
// the number of rows in the call or how threads split it. So a row's result does not depend on the
// rows beside it: a verify pass over 1 + k tokens gives the bits of k + 1 one-token steps, and a
// prompt pass of any length the bits its tokens would get one at a time.
//
// This file holds the AVX2 build (each chunk of 32 weights decoded in four 8-lane registers, then
// four FMAs and an add per row) and the entry points; gguf_matmul_avx512.cpp decodes in registers
// where the CPU has AVX-512. Threads split the output columns.
#include "ops.h"
#include "gguf_blocks.h"

namespace specserve {
namespace gguf {

// Whether passes of many rows take columns_panels (a test and bench/gguf_panels_ab.py switch it off to
// compare with whole columns: the same bits, other speed). Never switch while generating.
bool& panels_on() {
  static bool on = true;
  return on;
}

namespace {

constexpr int MAX_TILE_ROWS = 8;  // R accumulators + 4 weight vectors + a partial product: 13 registers
constexpr int64_t GROUP = 16;     // output columns whose weights stay in cache while every row tile reads them
constexpr int64_t PANEL_ELEMS = 256;  // weights a column runs over before the next (columns_panels): 8 KB of 8 rows
constexpr int64_t PANEL_MIN_ROWS = 16;  // fewer rows stream the weights (memory-bound): whole columns read them in order

// 32 bytes -> four 8-lane float vectors (elements 0..7, 8..15, 16..23, 24..31), unsigned or signed.
template <bool SIGNED>
inline void bytes_to_ps(__m256i v, __m256 w[4]) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int i = 0; i < 4; ++i)
    w[i] = _mm256_cvtepi32_ps(SIGNED ? _mm256_cvtepi8_epi32(part[i]) : _mm256_cvtepu8_epi32(part[i]));
}

inline void scale(__m256 w[4], __m256 d, __m256 m) {
  for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(w[i], d, m);
}

// One block decoded in registers to the reference's exact values (see gguf_matmul_avx512.cpp for why
// each FMA is exact), a chunk of 32 at a time: sink(w[4], offset of the chunk in the block).
template <int T, class Sink>
inline void decode_chunks(const uint8_t* b, Sink&& sink) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 w[4];
  if constexpr (T == Q4_K) {
    // The block's 8 scales d sc and 8 mins -(dmin m) as two vectors (the same float products as one at
    // a time), a chunk's pair taken by a lane permute, and the nibbles widened from memory: 1.35x at
    // one row on a Zen 3 (docs/decisions.md#fp32-avx2-q4k)
    uint32_t u[4];
    k4_scales_mins(b + 4, u);
    const __m256i sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u)));
    const __m256i mm = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 2)));
    const __m256 ds = _mm256_mul_ps(_mm256_set1_ps(fp16(b)), _mm256_cvtepi32_ps(sm));
    const __m256 dm = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(fp16(b + 2)), _mm256_cvtepi32_ps(mm)), _mm256_set1_ps(-0.0f));
    const __m256i low = _mm256_set1_epi32(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i idx = _mm256_set1_epi32(2 * j + h);
        const __m256 d = _mm256_permutevar8x32_ps(ds, idx), m = _mm256_permutevar8x32_ps(dm, idx);
        for (int i = 0; i < 4; ++i) {
          const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 16 + 32 * j + 8 * i)));
          w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, low)), d, m);
        }
        sink(w, 64 * j + 32 * h);
      }
    }
  } else if constexpr (T == Q6_K) {
    const float d = fp16(b + 208);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
      for (int c = 0; c < 4; ++c) {
        const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (c & 1)));
        const __m256i lo = _mm256_and_si256(c >> 1 ? _mm256_srli_epi16(l, 4) : l, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), _mm256_set1_epi8(0x03));
        bytes_to_ps<false>(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), w);
        const float s0 = d * sc[2 * c], s1 = d * sc[2 * c + 1];
        for (int i = 0; i < 4; ++i) {
          const float si = i < 2 ? s0 : s1;
          w[i] = _mm256_fmadd_ps(w[i], _mm256_set1_ps(si), _mm256_set1_ps(-32.0f * si));
        }
        sink(w, 128 * h + 32 * c);
      }
    }
  } else if constexpr (T == Q8_0) {
    bytes_to_ps<true>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), w);
    const __m256 d = _mm256_set1_ps(fp16(b));
    for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(w[i], d);
    sink(w, 0);
  } else {  // Q4_0 / Q4_1 / Q5_0 / Q5_1
    constexpr bool five = T == Q5_0 || T == Q5_1, has_min = T == Q4_1 || T == Q5_1;
    const uint8_t* qs = b + (has_min ? 4 : 2) + (five ? 4 : 0);
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low4);
    if constexpr (five) {
      uint32_t qh;
      std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
      q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
    }
    bytes_to_ps<false>(q, w);
    const __m256 d = _mm256_set1_ps(fp16(b));
    scale(w, d, has_min ? _mm256_set1_ps(fp16(b + 2)) : _mm256_mul_ps(d, _mm256_set1_ps(five ? -16.0f : -8.0f)));
    sink(w, 0);
  }
}

// Blocks [b0, b1) of one output column against R rows, added to acc in block order.
template <int R, int T>
inline void column_blocks(const Segment& s, int64_t col, const float* x, int64_t K, int64_t r0, int64_t b0,
                          int64_t b1, __m256 acc[R]) {
  const int elems = block_elems(T), bytes = block_bytes(T);
  const uint8_t* row = s.data + col * s.row_bytes;
  for (int64_t b = b0; b < b1; ++b) {
    decode_chunks<T>(row + b * bytes, [&](const __m256 w[4], int c) {
      for (int r = 0; r < R; ++r) {
        const float* xb = x + (r0 + r) * K + b * elems + c;
        __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
        t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), t);
        t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), t);
        t = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), t);
        acc[r] = _mm256_add_ps(acc[r], t);
      }
    });
  }
}

template <int R, int T>
void column(const Segment& s, int64_t col, const float* x, int64_t K, float* y, int64_t N, int64_t r0) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  column_blocks<R, T>(s, col, x, K, r0, 0, K / block_elems(T), acc);
  for (int r = 0; r < R; ++r) y[(r0 + r) * N + s.first + col] = hsum(acc[r]);
}

// Several rows: the same sums, the loops turned so that the rows' activations stay in L1. Each
// column runs over a panel of PANEL_ELEMS weights at a time, its R accumulators kept between panels
// (in acc_store), so each output still adds its chunks in block order and is reduced once at the end:
// the bits of `column`. Whole columns at once read R rows of K floats per column, which past ~1,000
// floats a row (8 rows of the 1.5B's 1,536: 48 KB) no longer fit in L1 and come from L2 each time.
template <int R, int T>
void columns_panels(const Segment& s, int64_t c0, int64_t c1, const Call& c, int64_t r0) {
  const int64_t nb = c.K / block_elems(T), panel = std::max<int64_t>(1, PANEL_ELEMS / block_elems(T));
  __m256 acc_store[GROUP][R];
  for (int64_t j = 0; j < c1 - c0; ++j)
    for (int r = 0; r < R; ++r) acc_store[j][r] = _mm256_setzero_ps();
  for (int64_t p0 = 0; p0 < nb; p0 += panel)
    for (int64_t col = c0; col < c1; ++col) column_blocks<R, T>(s, col, c.x, c.K, r0, p0, std::min(nb, p0 + panel), acc_store[col - c0]);
  for (int64_t col = c0; col < c1; ++col)
    for (int r = 0; r < R; ++r) c.y[(r0 + r) * c.N + s.first + col] = hsum(acc_store[col - c0][r]);
}

template <int R, int T>
void columns(const Segment& s, int64_t c0, int64_t c1, const Call& c, int64_t r0) {
  if (c.M >= PANEL_MIN_ROWS && c.K > PANEL_ELEMS && panels_on()) return columns_panels<R, T>(s, c0, c1, c, r0);
  for (int64_t col = c0; col < c1; ++col) column<R, T>(s, col, c.x, c.K, c.y, c.N, r0);
}

template <int T>
void columns_type(int rows, const Segment& s, int64_t c0, int64_t c1, const Call& c, int64_t r0) {
  switch (rows) {
    case 1: columns<1, T>(s, c0, c1, c, r0); break;
    case 2: columns<2, T>(s, c0, c1, c, r0); break;
    case 3: columns<3, T>(s, c0, c1, c, r0); break;
    case 4: columns<4, T>(s, c0, c1, c, r0); break;
    case 5: columns<5, T>(s, c0, c1, c, r0); break;
    case 6: columns<6, T>(s, c0, c1, c, r0); break;
    case 7: columns<7, T>(s, c0, c1, c, r0); break;
    default: columns<8, T>(s, c0, c1, c, r0); break;
  }
}

void columns_rows(int rows, const Segment& s, int64_t c0, int64_t c1, const Call& c, int64_t r0) {
  switch (s.type) {
    case Q4_0: return columns_type<Q4_0>(rows, s, c0, c1, c, r0);
    case Q4_1: return columns_type<Q4_1>(rows, s, c0, c1, c, r0);
    case Q5_0: return columns_type<Q5_0>(rows, s, c0, c1, c, r0);
    case Q5_1: return columns_type<Q5_1>(rows, s, c0, c1, c, r0);
    case Q8_0: return columns_type<Q8_0>(rows, s, c0, c1, c, r0);
    case Q4_K: return columns_type<Q4_K>(rows, s, c0, c1, c, r0);
    case Q6_K: return columns_type<Q6_K>(rows, s, c0, c1, c, r0);
    default: return;
  }
}

}  // namespace

void run_avx2(const Call& c, int64_t n0, int64_t n1) {
  for (int i = 0; i < c.nsegs; ++i) {
    const Segment& s = c.segs[i];
    const int64_t a = std::max(n0, s.first), b = std::min(n1, s.first + s.rows);
    for (int64_t g = a; g < b; g += GROUP) {
      const int64_t g1 = std::min(g + GROUP, b);
      for (int64_t r0 = 0; r0 < c.M; r0 += MAX_TILE_ROWS)
        columns_rows(static_cast<int>(std::min<int64_t>(MAX_TILE_ROWS, c.M - r0)), s, g - s.first, g1 - s.first, c, r0);
    }
  }
}

}  // namespace gguf

namespace {

// Whether calls use the AVX-512 build (as block_kernel_avx512 switches block_matmul's).
bool use_avx512() { return block_kernel_avx512(c10::nullopt); }

std::vector<gguf::Segment> segments(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types,
                                    int64_t K) {
  TORCH_CHECK(!raws.empty() && raws.size() == types.size(), "gguf_linear: one type per weight segment");
  std::vector<gguf::Segment> segs;
  int64_t first = 0;
  for (size_t i = 0; i < raws.size(); ++i) {
    const at::Tensor& r = raws[i];
    const int t = static_cast<int>(types[i]);
    const int elems = gguf::block_elems(t);
    TORCH_CHECK(elems > 0, "gguf_linear: GGML type ", t, " is not one the kernels take");
    TORCH_CHECK(r.dtype() == at::kByte && r.dim() == 2 && r.stride(1) == 1, "gguf_linear: raw blocks must be u8 [rows, bytes]");
    TORCH_CHECK(K % elems == 0 && r.size(1) == K / elems * gguf::block_bytes(t),
                "gguf_linear: a row of ", r.size(1), " bytes is not ", K, " elements of GGML type ", t);
    segs.push_back({r.data_ptr<uint8_t>(), t, r.size(0), r.stride(0), first});
    first += r.size(0);
  }
  return segs;
}

}  // namespace

at::Tensor gguf_linear(at::Tensor x, const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types) {
  // x: [M, K] f32; raws[i]: [N_i, bytes per row] u8 in GGML type types[i] -> y: [M, sum N_i] f32
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2, "x must be f32 [M, K]");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  const std::vector<gguf::Segment> segs = segments(raws, types, K);
  const int64_t N = segs.back().first + segs.back().rows;
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  gguf::Call call{segs.data(), static_cast<int>(segs.size()), x.data_ptr<float>(), y.data_ptr<float>(), M, K, N};
  const bool avx512 = use_avx512();
  const int64_t grain = std::max<int64_t>(16, N / (4 * at::get_num_threads()));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    if (avx512) gguf::run_avx512(call, n0, n1);
    else gguf::run_avx2(call, n0, n1);
  });
  return y;
}

bool gguf_kernel_panels(c10::optional<bool> enable) {
  if (enable) gguf::panels_on() = *enable;
  return gguf::panels_on();
}

at::Tensor gguf_dequantize_rows(at::Tensor raw, int64_t type, at::Tensor ids, int64_t K) {
  // raw: [N, bytes per row] u8; ids: [T] int64 -> [T, K] f32 (an embedding lookup, or the whole
  // table with ids = arange(N))
  const int t = static_cast<int>(type), elems = gguf::block_elems(t), bytes = gguf::block_bytes(t);
  TORCH_CHECK(elems > 0 && K % elems == 0 && raw.size(1) == K / elems * bytes, "gguf_dequantize_rows: bad type or width");
  TORCH_CHECK(ids.dtype() == at::kLong, "ids must be int64");
  ids = ids.contiguous();
  const int64_t T = ids.numel(), N = raw.size(0), stride = raw.stride(0);
  auto y = at::empty({T, K}, at::kFloat);
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* base = raw.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  for (int64_t i = 0; i < T; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < N, "gguf_dequantize_rows: id out of range");
  at::parallel_for(0, T, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t b = 0; b < K / elems; ++b) gguf::decode_block(t, base + id[i] * stride + b * bytes, out + i * K + b * elems);
  });
  return y;
}

}  // namespace specserve
