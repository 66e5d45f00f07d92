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
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace {

constexpr int QK = 32;
constexpr int ROWS = 8;

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

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

// ---- fused element-wise ops for the fp32 CPU path (each replaces 4-8 small torch ops) ----

// out = w * x / rms(x) over the last dim; if residual is given, x += residual first (in place).
torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps) {
  TORCH_CHECK(x.is_contiguous() && x.dtype() == torch::kFloat32, "x must be contiguous f32");
  const int64_t T = x.size(0), H = x.size(1);
  auto out = torch::empty_like(x);
  float* xp = x.data_ptr<float>();
  const float* rp = residual ? residual->contiguous().data_ptr<float>() : nullptr;
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* row = xp + t * H;
    if (rp) for (int64_t i = 0; i < H; ++i) row[i] += rp[t * H + i];
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(row[i]) * row[i];
    // fp32 like torch's mean(x^2); double accumulation only makes it closer to exact.
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / H) + static_cast<float>(eps));
    for (int64_t i = 0; i < H; ++i) op[t * H + i] = wp[i] * (row[i] * inv);
  }
  return out;
}

// Rotate-half RoPE in place on the first `heads` heads of each row of qkv [T, (H + 2 Hkv) * D].
void rope_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t D) {
  const int64_t T = qkv.size(0), stride = qkv.size(1), half = D / 2;
  float* p = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* x = p + t * stride + h * D;
      const float* ct = c + t * D;
      const float* st = s + t * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * ct[i] - b * st[i];
        x[i + half] = b * ct[i + half] + a * st[i + half];
      }
    }
}

// ---- paged attention for short query spans (decode tokens, verify spans) ----

// exp for 8 floats (Cephes polynomial, as in avx_mathfun): ~1e-7 relative error.
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

// [T, 2F] (gate | up) -> silu(gate) * up = gate / (1 + exp(-gate)) * up  [T, F]
torch::Tensor silu_mul(torch::Tensor gu) {
  const int64_t T = gu.size(0), F = gu.size(1) / 2;
  auto out = torch::empty({T, F}, gu.options());
  const float* g = gu.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    const float* gt = g + t * 2 * F;
    float* ot = o + t * F;
    int64_t i = 0;
    for (; i + 8 <= F; i += 8) {
      const __m256 a = _mm256_loadu_ps(gt + i);
      const __m256 e = exp256(_mm256_sub_ps(zero, a));
      _mm256_storeu_ps(ot + i, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(one, e)), _mm256_loadu_ps(gt + F + i)));
    }
    for (; i < F; ++i) ot[i] = gt[i] / (1.0f + std::exp(-gt[i])) * gt[F + i];
  }
  return out;
}

// q [T, H, D]; caches [slots, Hkv, D]; block_tables [B, max_blocks]; per sequence: first row in q,
// number of new tokens, context length (new tokens included). Sequence b's query i sits at position
// kv_len - q_len + i and attends to keys 0..that position. D must be a multiple of 8.
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor q_starts, torch::Tensor q_lens,
                              torch::Tensor kv_lens, int64_t block_size, double scale) {
  const int64_t H = q.size(1), D = q.size(2), Hkv = k_cache.size(1), B = q_lens.size(0);
  const int64_t group = H / Hkv, max_blocks = block_tables.size(1), VD = D / 8;
  TORCH_CHECK(D % 8 == 0 && D <= 256, "head_dim must be a multiple of 8, at most 256");
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* qs = q_starts.data_ptr<int64_t>();
  const int64_t* ql = q_lens.data_ptr<int64_t>();
  const int64_t* kl = kv_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  int64_t max_kv = 0;
  for (int64_t b = 0; b < B; ++b) max_kv = std::max(max_kv, kl[b]);
  at::parallel_for(0, B * H, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores(max_kv + 8);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / H, h = w % H, kvh = h / group;
      const int64_t* table = bt + b * max_blocks;
      for (int64_t i = 0; i < ql[b]; ++i) {
        const int64_t t = qs[b] + i, n = kl[b] - ql[b] + i + 1;  // keys this query sees
        const float* qv = qp + (t * H + h) * D;
        __m256 qreg[32];
        for (int64_t d = 0; d < VD; ++d) qreg[d] = _mm256_mul_ps(_mm256_loadu_ps(qv + 8 * d), _mm256_set1_ps(scale));
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t slot = table[j / block_size] * block_size + j % block_size;
          const float* kv = kp + (slot * Hkv + kvh) * D;
          __m256 acc = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(kv));
          for (int64_t d = 1; d < VD; ++d) acc = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(kv + 8 * d), acc);
          scores[j] = hsum(acc);
          mx = std::max(mx, scores[j]);
        }
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vsum = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
          __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores.data() + j), vmx));
          _mm256_storeu_ps(scores.data() + j, e);
          vsum = _mm256_add_ps(vsum, e);
        }
        float sum = hsum(vsum);
        if (j < n) {  // the tail, padded with -inf so exp gives 0
          float tail[8];
          for (int64_t u = 0; u < 8; ++u) tail[u] = j + u < n ? scores[j + u] - mx : -INFINITY;
          __m256 e = exp256(_mm256_loadu_ps(tail));
          _mm256_storeu_ps(tail, e);
          for (int64_t u = 0; j + u < n; ++u) { scores[j + u] = tail[u]; sum += tail[u]; }
        }
        __m256 o[32];
        for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_setzero_ps();
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t slot = table[jj / block_size] * block_size + jj % block_size;
          const float* vv = vp + (slot * Hkv + kvh) * D;
          const __m256 p = _mm256_set1_ps(scores[jj]);
          for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vv + 8 * d), o[d]);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sum);
        float* ov = op + (t * H + h) * D;
        for (int64_t d = 0; d < VD; ++d) _mm256_storeu_ps(ov + 8 * d, _mm256_mul_ps(o[d], inv));
      }
    }
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_matmul", &block_matmul, "y = x @ dequant(W)^T for GGML-blocked W (fp32 in/out)");
  m.def("rms_norm", &rms_norm, "(x += residual); w * x / rms(x)");
  m.def("rope_", &rope_, "rotate-half RoPE in place on the first heads of qkv rows");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("paged_attention", &paged_attention, "causal attention of short query spans over the paged KV cache");
}
