// y = x @ W^T with W kept in GGML blocks of 32 (Q4_1 / Q4_0 / Q8_0), x and y float32.
//
// The weights are never rounded to anything: each block is w_j = d * q_j + m (fp16 d, m widened to
// fp32 exactly), and we compute  sum_b d_b (sum_j q_j x_j)  +  sum_b m_b (sum_j x_j)  in fp32. That
// is the same sum as x @ dequantize(W)^T in another order, so logits agree with a dense fp32 model to
// rounding (~1e-6 relative), while each weight costs 5 bits of memory traffic instead of 32.
// Activations stay fp32 (unlike llama.cpp, which rounds them to 8 bits).
//
// Every output y[r, n] is computed in one fixed order (one 8-lane accumulator over the blocks, then
// the min term), however many rows the call has and however the work is split. So a row's result
// does not depend on the other rows: a verify pass over 1 + k tokens gives, bit for bit, the logits
// and KV that k + 1 one-token steps would, and greedy speculative decoding reproduces greedy regular
// decoding exactly, not merely up to near-ties (for passes this build serves: up to AMX_MIN_ROWS - 1
// rows where weights have an AMX copy, else up to BLOCK_KERNEL_MAX_ROWS in models/layers.py; larger
// passes round differently, on AMX or in dense fp32 products).
//
// Threads split the output columns (at::parallel_for); within a thread, each unpacked weight block
// feeds up to 8 activation rows (decode batches and verify spans) held in registers, and weight
// columns are prefetched a few ahead. On CPUs with AVX-512, calls go to block_matmul_avx512.cpp
// instead (same contract, fewer operations per row). On CPUs with AMX tiles, weights also get a
// packed copy for block_matmul_amx.cpp, and block_linear sends passes of more than
// AMX_MIN_ROWS rows there (see block_linear).
#include "ops.h"
#include "block_tile.h"

namespace specserve {
namespace {

using block::Args;
using block::prefetch_column;
using block::PREFETCH_COLUMNS;

// hsum(a) + sum_b m_b * xsum_b (Q4 only), 8 blocks at a time: how every output ends.
template <bool Q4>
inline float finish(const float* m_row, const float* xs, int64_t nblocks, __m256 a) {
  int64_t b = 0;
  if (Q4)
    for (; b + 8 <= nblocks; b += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(m_row + b), _mm256_loadu_ps(xs + b), a);
  float total = hsum(a);
  if (Q4)
    for (; b < nblocks; ++b) total += m_row[b] * xs[b];
  return total;
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

// Output column n for rows r0 .. r0+R-1. Per block: t = q . x with the unscaled integers (a product
// and three FMAs over the block's four chunks), then acc += d * t; at the end the min term. The
// same sequence of operations for every row, whatever R: R only sets how many rows share an unpacked
// block. (One row is bound by the unpacking, and consecutive blocks' dot products overlap in the
// out-of-order window; R rows add 5 FMAs per block each.)
template <int R, bool Q4>
inline void column(const Args& a, int64_t r0, int64_t n) {
  const uint8_t* qs = a.qs + n * a.row_bytes;
  const float* d = a.d + n * a.nblocks;
  const float* x = a.x + r0 * a.K;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nblocks; ++b) {
    __m256 q[4];
    if (Q4) unpack_q4(qs + b * (QK / 2), q);
    else unpack_q8(reinterpret_cast<const int8_t*>(qs) + b * QK, q);
    const __m256 db = _mm256_set1_ps(d[b]);
    for (int r = 0; r < R; ++r) {
      const float* xb = x + r * a.K + b * QK;
      __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
      t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), t);
      t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
      t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t);
      acc[r] = _mm256_fmadd_ps(db, t, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    a.y[(r0 + r) * a.N + n] = finish<Q4>(Q4 ? a.m + n * a.nblocks : nullptr,
                                         Q4 ? a.xsum + (r0 + r) * a.nblocks : nullptr, a.nblocks, acc[r]);
}

template <int R, bool Q4>
inline void columns(const Args& a, int64_t r0, int64_t n0, int64_t n1, int64_t n_end) {
  for (int64_t n = n0; n < n1; ++n) {
    if (r0 == 0 && n + PREFETCH_COLUMNS < n_end) prefetch_column(a, n + PREFETCH_COLUMNS);
    column<R, Q4>(a, r0, n);
  }
}

constexpr int MAX_TILE_ROWS = 8;  // R accumulators + 4 unpacked chunks + a dot product: 13 registers

template <bool Q4>
void columns_rows(int R, const Args& a, int64_t r0, int64_t n0, int64_t n1, int64_t n_end) {
  switch (R) {
    case 1: columns<1, Q4>(a, r0, n0, n1, n_end); break;
    case 2: columns<2, Q4>(a, r0, n0, n1, n_end); break;
    case 3: columns<3, Q4>(a, r0, n0, n1, n_end); break;
    case 4: columns<4, Q4>(a, r0, n0, n1, n_end); break;
    case 5: columns<5, Q4>(a, r0, n0, n1, n_end); break;
    case 6: columns<6, Q4>(a, r0, n0, n1, n_end); break;
    case 7: columns<7, Q4>(a, r0, n0, n1, n_end); break;
    default: columns<8, Q4>(a, r0, n0, n1, n_end); break;
  }
}

template <bool Q4>
void run(const Args& a, int64_t M, int64_t n0, int64_t n1) {
  block::for_each_tile<MAX_TILE_ROWS>(M, n0, n1, [&](int rows, int64_t r0, int64_t g0, int64_t g1) {
    columns_rows<Q4>(rows, a, r0, g0, g1, n1);
  });
}

// Whether calls use the AVX-512 build: where the CPU has it, unless SPECSERVE_NO_AVX512 is set or a
// test switches it (block_kernel_avx512). Never switch while generating: a row's bits would change.
bool& use_avx512() {
  static bool on = block::cpu_has_avx512() && !std::getenv("SPECSERVE_NO_AVX512");
  return on;
}

}  // namespace

bool block_kernel_avx512(c10::optional<bool> enable) {
  if (enable) use_avx512() = *enable && block::cpu_has_avx512();
  return use_avx512();
}

at::Tensor block_matmul(at::Tensor x, at::Tensor qs, at::Tensor scales, at::Tensor mins,
                        bool is_q4) {
  // x: [M, K] f32; qs: [N, K/2] u8 (Q4) or [N, K] i8 (Q8); scales, mins: [N, K/32] f32 -> y: [M, N] f32
  TORCH_CHECK(x.dtype() == at::kFloat && x.is_contiguous() && x.dim() == 2, "x must be contiguous f32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0);
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32");
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const bool avx512 = use_avx512();
  at::Tensor xsum;
  if (is_q4 && !avx512) {  // [M, K/32] block sums of x, for the min term (the AVX-512 build folds m into w)
    xsum = at::empty({M, K / QK}, x.options());
    const float* xs = x.data_ptr<float>();
    float* ps = xsum.data_ptr<float>();
    for (int64_t i = 0; i < M * (K / QK); ++i) {
      __m256 a = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xs + i * QK), _mm256_loadu_ps(xs + i * QK + 8)),
                               _mm256_add_ps(_mm256_loadu_ps(xs + i * QK + 16), _mm256_loadu_ps(xs + i * QK + 24)));
      ps[i] = hsum(a);
    }
  }
  Args args{qs.data_ptr<uint8_t>(), scales.data_ptr<float>(), is_q4 ? mins.data_ptr<float>() : nullptr,
            x.data_ptr<float>(), xsum.defined() ? xsum.data_ptr<float>() : nullptr, y.data_ptr<float>(),
            N, K, K / QK, is_q4 ? K / 2 : K};
  const int64_t grain = std::max<int64_t>(16, N / (4 * at::get_num_threads()));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    if (avx512) block::run_avx512(args, M, n0, n1, is_q4);
    else if (is_q4) run<true>(args, M, n0, n1);
    else run<false>(args, M, n0, n1);
  });
  return y;
}

// Up to this many rows a pass runs on the AVX builds, above it on AMX (where the weights have a
// packed copy). All layers' and the head's products of the embedded model, ms (AVX-512 / AMX), on a
// 2-core Xeon: 1 row 6.0 / 13.0, 4 rows 9.2 / 13.3, 8 rows 13.7 / 13.9, 16 rows 26.6 / 17.2, 32 rows
// 51.6 / 26.0. Each build keeps a row's bits independent of the rows beside it, but the two builds
// round differently (both to fp32 accuracy): a row can differ in its last bits between a pass below
// and a pass above the threshold, as between the block kernel and dense products past
// BLOCK_KERNEL_MAX_ROWS. A one-token step with its verify span of up to 8 rows stays on one build.
constexpr int64_t AMX_MIN_ROWS = 9;

at::Tensor block_linear(at::Tensor x, const std::vector<at::Tensor>& w) {
  // w: [qs, scales, mins] as block_matmul takes them, + [packed, scales, mins] from block_pack_amx;
  // or GGUF's own blocks: [raw_0 .. raw_k-1, types] with types an int64 [k] (gguf_linear's segments)
  // or int8 activations: [packed..., raw..., meta] with meta an int32 [k, 2] (q8_linear's)
  if (w.back().scalar_type() == at::kInt) return q8_linear(x, w);
  if (w.back().scalar_type() == at::kLong) {
    const at::Tensor types = w.back().contiguous();
    return gguf_linear(x, std::vector<at::Tensor>(w.begin(), w.end() - 1),
                       std::vector<int64_t>(types.data_ptr<int64_t>(), types.data_ptr<int64_t>() + types.numel()));
  }
  const bool is_q4 = w[2].numel() > 0;
  if (w.size() == 6 && x.size(0) >= AMX_MIN_ROWS) return block_matmul_amx(x.contiguous(), w[3], w[4], w[5], is_q4);
  return block_matmul(x, w[0], w[1], w[2], is_q4);
}

}  // namespace specserve
