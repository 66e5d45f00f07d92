// One token per row by inverting the CDF (sampling/sampler.py's draw): the first i whose cumulative
// mass exceeds u * total. torch's cumsum adds a 262k-token row one element after the other (a chain
// of dependent double adds) after converting it to double: ~0.25 ms a row, a sixth of a batch-8 step
// of Gemma 3 270M. Here the mass is summed per block of 64 (vector adds), the block holding u * total
// is found over the block sums, and only that block is walked element by element: ~0.04 ms.
//
// The cumulative sums are the same numbers up to rounding (doubles over fp32 values), so a draw
// differs from the sequential one only when u * total lies within a few ulps of a boundary between
// two tokens. A token of zero mass is never drawn: the walk stops only on an add that exceeds the
// target, which a zero cannot do.
#include "ops.h"

namespace specserve {
namespace {

constexpr int64_t BLOCK = 64;

// Sum of p[0..n) in double, four lanes of four (the order is fixed: the draw does not depend on threads).
double block_sum(const float* p, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_pd(acc[k], _mm256_cvtps_pd(_mm_loadu_ps(p + i + 4 * k)));
  const __m256d s = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, s);
  double total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) total += static_cast<double>(p[i]);
  return total;
}

int64_t draw_row(const float* p, int64_t V, double u, std::vector<double>& sums) {
  const int64_t nb = (V + BLOCK - 1) / BLOCK;
  sums.resize(nb);
  double total = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    sums[b] = block_sum(p + b * BLOCK, std::min(BLOCK, V - b * BLOCK));
    total += sums[b];
  }
  const double target = u * total;
  double acc = 0.0;
  int64_t b = 0;
  while (b < nb && !(acc + sums[b] > target)) acc += sums[b++];
  if (b < nb) {
    for (int64_t i = b * BLOCK; i < V; ++i) {  // on past the block where rounding asks
      acc += static_cast<double>(p[i]);
      if (acc > target) return i;
    }
  }
  for (int64_t i = V - 1; i >= 0; --i)  // u * total rounded up to the total (or no mass, or NaNs): the last token with mass
    if (p[i] > 0.0f) return i;
  return V - 1;
}

}  // namespace

// probs [N, V] f32 (non-negative, any scale), u [N] f64 in [0, 1) -> [N] int64
at::Tensor draw_rows(at::Tensor probs, at::Tensor u) {
  TORCH_CHECK(probs.device().is_cpu() && probs.dtype() == at::kFloat && probs.dim() == 2 && probs.is_contiguous(),
              "draw_rows: probs must be contiguous f32 [N, V] on the CPU");
  const int64_t N = probs.size(0), V = probs.size(1);
  TORCH_CHECK(V > 0, "draw_rows: an empty vocabulary");
  TORCH_CHECK(u.dtype() == at::kDouble && u.numel() == N, "draw_rows: one f64 uniform per row");
  auto uc = u.contiguous();
  auto out = at::empty({N}, at::kLong);
  const float* p = probs.data_ptr<float>();
  const double* up = uc.data_ptr<double>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> sums;
    for (int64_t r = r0; r < r1; ++r) op[r] = draw_row(p + r * V, V, up[r], sums);
  });
  return out;
}

}  // namespace specserve
