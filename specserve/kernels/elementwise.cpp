// Fused element-wise ops for the fp32 CPU path (each replaces 4-8 small torch ops).
#include "ops.h"

namespace specserve {

// out = w * x / rms(x) over the last dim; if residual is given, x += residual first (in place).
at::Tensor rms_norm(at::Tensor x, c10::optional<at::Tensor> residual, at::Tensor w, double eps) {
  TORCH_CHECK(x.is_contiguous() && x.dtype() == at::kFloat && x.dim() == 2, "x must be contiguous f32 [T, H]");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(w.dtype() == at::kFloat && w.is_contiguous() && w.numel() == H, "w must be f32 [", H, "]");
  at::Tensor r;  // held: a temporary's data pointer would dangle
  if (residual) {
    r = residual->contiguous();
    TORCH_CHECK(r.dtype() == at::kFloat && r.sizes() == x.sizes(), "residual must be f32 like x");
  }
  auto out = at::empty_like(x);
  float* xp = x.data_ptr<float>();
  const float* rp = residual ? r.data_ptr<float>() : nullptr;
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
void rope_(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t heads, int64_t D) {
  TORCH_CHECK(qkv.dtype() == at::kFloat && qkv.is_contiguous() && qkv.dim() == 2, "qkv must be contiguous f32 [T, n]");
  const int64_t T = qkv.size(0), stride = qkv.size(1), half = D / 2;
  TORCH_CHECK(heads >= 0 && D > 0 && D % 2 == 0 && heads * D <= stride, "rope_: ", heads, " heads of ", D, " do not fit rows of ", stride);
  TORCH_CHECK(cos.dtype() == at::kFloat && sin.dtype() == at::kFloat && cos.is_contiguous() && sin.is_contiguous()
              && cos.dim() == 2 && cos.size(0) == T && cos.size(1) == D && sin.sizes() == cos.sizes(),
              "cos/sin must be contiguous f32 [T, D]");
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

// [T, 2F] (gate | up) -> silu(gate) * up = gate / (1 + exp(-gate)) * up  [T, F]
at::Tensor silu_mul(at::Tensor gu) {
  TORCH_CHECK(gu.dtype() == at::kFloat && gu.is_contiguous() && gu.dim() == 2 && gu.size(1) % 2 == 0,
              "gate_up must be contiguous f32 [T, 2F]");
  const int64_t T = gu.size(0), F = gu.size(1) / 2;
  auto out = at::empty({T, F}, gu.options());
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

}  // namespace specserve
