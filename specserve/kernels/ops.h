// Shared helpers and the ops each kernel file defines (compiled together as one extension).
#pragma once
// ATen's Tensor, parallel_for and the three factories the kernels call, not <torch/extension.h>:
// that header (autograd, nn, pybind11) took most of each file's compile time; only the binding file
// (decoder_layer.cpp) includes it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <immintrin.h>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace specserve {

constexpr int QK = 32;  // GGML block size of Q4_0 / Q4_1 / Q8_0

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

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

at::Tensor block_matmul(at::Tensor x, at::Tensor qs, at::Tensor scales, at::Tensor mins, bool is_q4);
bool block_kernel_avx512(c10::optional<bool> enable);  // which build block_matmul uses (and switch it)
// The AMX build (block_matmul_amx.cpp), over weights regrouped once by block_pack_amx.
std::vector<at::Tensor> block_pack_amx(at::Tensor qs, at::Tensor scales, at::Tensor mins, bool is_q4);
at::Tensor block_matmul_amx(at::Tensor x, at::Tensor packed, at::Tensor scales, at::Tensor mins,
                            bool is_q4);
bool block_kernel_amx();  // whether this CPU and kernel give AMX tiles
// A blocked weight's product, on the build that suits the pass (w: 3 parts, or 6 with the AMX copy).
at::Tensor block_linear(at::Tensor x, const std::vector<at::Tensor>& w);
// GGUF's own blocks, read in place (gguf_matmul.cpp): raws[i] [N_i, bytes per row] u8 of GGML type types[i].
at::Tensor gguf_linear(at::Tensor x, const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types);
at::Tensor gguf_dequantize_rows(at::Tensor raw, int64_t type, at::Tensor ids, int64_t K);
bool gguf_kernel_panels(c10::optional<bool> enable);  // whether gguf_linear's AVX2 build runs many rows in panels (and switch it)
// Int8 activations (q8_matmul.cpp): weights regrouped by q8_pack, parts as Int8Weight.parts gives them.
at::Tensor q8_pack(at::Tensor raw, int64_t type, int64_t K);
at::Tensor q8_linear(at::Tensor x, const std::vector<at::Tensor>& w);
at::Tensor q8_reference(at::Tensor x, const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types);
bool q8_build_agrees(const std::string& want);  // the start-up check a build must pass to be the default
std::string q8_kernel_build(c10::optional<std::string> want);  // q8_linear's build: amx, vnni, avx2, reference, ...
at::Tensor rms_norm(at::Tensor x, c10::optional<at::Tensor> residual, at::Tensor w, double eps);
void rope_(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t heads, int64_t D);
at::Tensor silu_mul(at::Tensor gu);
at::Tensor draw_rows(at::Tensor probs, at::Tensor u);  // sampling.cpp: inverse-CDF draws, one per row
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                           at::Tensor block_tables, at::Tensor q_starts, at::Tensor q_lens,
                           at::Tensor kv_lens, int64_t block_size, double scale,
                           c10::optional<at::Tensor> span_lens, c10::optional<at::Tensor> tree_mask,
                           int64_t window = 0);

}  // namespace specserve
