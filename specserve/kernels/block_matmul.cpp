// y = x @ W^T with W kept in GGML blocks of 32 (Q4_1 / Q4_0 / Q8_0), x and y float32.
//
// The weights are never rounded to anything: each block is w_j = d * q_j + m (fp16 d, m widened to
// fp32 exactly), and we compute  sum_b  d_b * (sum_j q_j * x_j)  +  m_b * (sum_j x_j)  in fp32.
// That is the same sum as x @ dequantize(W)^T in another order, so logits agree with a dense fp32
// model to rounding (~1e-6 relative), while each weight costs 5 bits of memory traffic instead of 32.
// Activations stay fp32 (unlike llama.cpp, which rounds them to 8 bits): lossless against fp32.
//
// Threads split the output columns (at::parallel_for); each thread walks up to ROWS activation rows
// at once so one unpacked weight block feeds ROWS FMAs (decode batches and verify spans).
#include "ops.h"

namespace specserve {
namespace {

constexpr int ROWS = 8;

// 16 packed bytes -> 32 floats: low nibbles are elements 0..15, high nibbles 16..31 (GGML order).
inline void unpack_q4(const uint8_t* qs, __m256 q[4]) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  __m128i mask = _mm_set1_epi8(0x0F);
  __m128i lo = _mm_and_si128(b, mask);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

inline void unpack_q8(const int8_t* qs, __m256 q[4]) {
  for (int i = 0; i < 4; ++i) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i));
    q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
}

template <bool Q4>
inline void unpack(const uint8_t* qs_row, int64_t b, __m256 q[4]) {
  if (Q4) unpack_q4(qs_row + b * (QK / 2), q);
  else unpack_q8(reinterpret_cast<const int8_t*>(qs_row) + b * QK, q);
}

template <bool Q4>
inline float min_term(const float* m_row, const float* xs, int64_t nblocks, __m256 a) {
  // hsum(a) + sum_b m_b * xsum_b, 8 blocks at a time
  int64_t b = 0;
  if (Q4)
    for (; b + 8 <= nblocks; b += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(m_row + b), _mm256_loadu_ps(xs + b), a);
  float total = hsum(a);
  if (Q4)
    for (; b < nblocks; ++b) total += m_row[b] * xs[b];
  return total;
}

// One row: nothing to amortise the scaling over, so each block's dot product t = q . x is scaled
// once (acc += d * t); two blocks in flight keep the FMA chains overlapping.
template <bool Q4>
inline void column1(const uint8_t* qs_row, const float* d_row, const float* m_row, const float* x,
                    const float* xsum, int64_t nblocks, float* y) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nblocks; b += 2) {
    __m256 q[4], p[4];
    unpack<Q4>(qs_row, b, q);
    unpack<Q4>(qs_row, b + 1, p);
    const float* xb = x + b * QK;
    __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
    __m256 u = _mm256_mul_ps(p[0], _mm256_loadu_ps(xb + QK));
    for (int j = 1; j < 4; ++j) {
      t = _mm256_fmadd_ps(q[j], _mm256_loadu_ps(xb + 8 * j), t);
      u = _mm256_fmadd_ps(p[j], _mm256_loadu_ps(xb + QK + 8 * j), u);
    }
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d_row[b]), t, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d_row[b + 1]), u, acc1);
  }
  if (b < nblocks) {
    __m256 q[4];
    unpack<Q4>(qs_row, b, q);
    const float* xb = x + b * QK;
    __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
    for (int j = 1; j < 4; ++j) t = _mm256_fmadd_ps(q[j], _mm256_loadu_ps(xb + 8 * j), t);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d_row[b]), t, acc0);
  }
  *y = min_term<Q4>(m_row, xsum, nblocks, _mm256_add_ps(acc0, acc1));
}

// One output column n for R activation rows.
// Each block's q is scaled by d once (d*q is exactly the dequantised weight minus the min), then
// feeds R rows with 4 FMAs each. Small R gets several accumulators per row so the FMA chains
// overlap; the min term sum_b m_b * xsum_b is one short dot product per row at the end.
template <int R, bool Q4>
inline void column(const uint8_t* qs_row, const float* d_row, const float* m_row, const float* x,
                   const float* xsum, int64_t K, int64_t nblocks, float* y, int64_t ldy) {
  if constexpr (R == 1) {
    column1<Q4>(qs_row, d_row, m_row, x, xsum, nblocks, y);
    return;
  }
  constexpr int ACC = R <= 2 ? 4 : (R <= 4 ? 2 : 1);
  __m256 acc[R][ACC];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < ACC; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    __m256 q[4];
    unpack<Q4>(qs_row, b, q);
    const __m256 d = _mm256_set1_ps(d_row[b]);
    for (int j = 0; j < 4; ++j) q[j] = _mm256_mul_ps(q[j], d);
    for (int r = 0; r < R; ++r) {
      const float* xb = x + r * K + b * QK;
      for (int j = 0; j < 4; ++j)
        acc[r][j % ACC] = _mm256_fmadd_ps(q[j], _mm256_loadu_ps(xb + 8 * j), acc[r][j % ACC]);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 a = acc[r][0];
    for (int j = 1; j < ACC; ++j) a = _mm256_add_ps(a, acc[r][j]);
    y[r * ldy] = min_term<Q4>(m_row, Q4 ? xsum + r * nblocks : nullptr, nblocks, a);
  }
}

template <int R, bool Q4>
void rows_chunk(const uint8_t* qs, const float* d, const float* m, const float* x, const float* xsum,
                int64_t N, int64_t K, float* y, int64_t n0, int64_t n1) {
  const int64_t nblocks = K / QK;
  const int64_t row_bytes = Q4 ? K / 2 : K;
  for (int64_t n = n0; n < n1; ++n)
    column<R, Q4>(qs + n * row_bytes, d + n * nblocks, Q4 ? m + n * nblocks : nullptr, x, xsum, K, nblocks,
                  y + n, N);
}

template <bool Q4>
void dispatch(int R, const uint8_t* qs, const float* d, const float* m, const float* x, const float* xsum,
              int64_t N, int64_t K, float* y, int64_t n0, int64_t n1) {
  switch (R) {
    case 1: rows_chunk<1, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    case 2: rows_chunk<2, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    case 3: rows_chunk<3, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    case 4: rows_chunk<4, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    case 5: rows_chunk<5, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    case 6: rows_chunk<6, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    case 7: rows_chunk<7, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
    default: rows_chunk<8, Q4>(qs, d, m, x, xsum, N, K, y, n0, n1); break;
  }
}

}  // namespace

torch::Tensor block_matmul(torch::Tensor x, torch::Tensor qs, torch::Tensor scales, torch::Tensor mins,
                           bool is_q4) {
  // x: [M, K] f32; qs: [N, K/2] u8 (Q4) or [N, K] i8 (Q8); scales, mins: [N, K/32] f32 -> y: [M, N] f32
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2, "x must be contiguous f32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0);
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32");
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  torch::Tensor xsum;
  if (is_q4) {  // [M, K/32] block sums of x, for the min term
    xsum = torch::empty({M, K / QK}, x.options());
    const float* xs = x.data_ptr<float>();
    float* ps = xsum.data_ptr<float>();
    for (int64_t i = 0; i < M * (K / QK); ++i) {
      __m256 a = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xs + i * QK), _mm256_loadu_ps(xs + i * QK + 8)),
                               _mm256_add_ps(_mm256_loadu_ps(xs + i * QK + 16), _mm256_loadu_ps(xs + i * QK + 24)));
      ps[i] = hsum(a);
    }
  }
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const float* dp = scales.data_ptr<float>();
  const float* mp = is_q4 ? mins.data_ptr<float>() : nullptr;
  const float* xp = x.data_ptr<float>();
  const float* sp = is_q4 ? xsum.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, N / (4 * at::get_num_threads()));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t r0 = 0; r0 < M; r0 += ROWS) {
      const int R = static_cast<int>(std::min<int64_t>(ROWS, M - r0));
      const float* xr = xp + r0 * K;
      const float* sr = is_q4 ? sp + r0 * (K / QK) : nullptr;
      if (is_q4) dispatch<true>(R, qp, dp, mp, xr, sr, N, K, yp + r0 * N, n0, n1);
      else dispatch<false>(R, qp, dp, mp, xr, sr, N, K, yp + r0 * N, n0, n1);
    }
  });
  return y;
}

}  // namespace specserve
