// Paged attention for short query spans (decode tokens, verify spans), straight from the KV blocks.
#include "ops.h"

namespace specserve {

// q [T, H, D]; caches [slots, Hkv, D]; block_tables [B, max_blocks]; per sequence: first row in q,
// number of new tokens, context length (new tokens included). Sequence b's query i sits at position
// kv_len - q_len + i and attends to keys 0..that position. D must be a multiple of 8.
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor q_starts, torch::Tensor q_lens,
                              torch::Tensor kv_lens, int64_t block_size, double scale) {
  // Every index the loops below follow is checked first: a bad table or length raises here instead
  // of reading or writing outside the cache (O(sequences + blocks), nothing next to the attention).
  TORCH_CHECK(q.dtype() == torch::kFloat32 && q.is_contiguous() && q.dim() == 3, "q must be contiguous f32 [T, H, D]");
  TORCH_CHECK(k_cache.dtype() == torch::kFloat32 && v_cache.dtype() == torch::kFloat32 && k_cache.is_contiguous()
              && v_cache.is_contiguous() && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(),
              "k_cache/v_cache must be contiguous f32 [slots, Hkv, D] of one shape");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(1), B = q_lens.size(0);
  TORCH_CHECK(D % 8 == 0 && D <= 256, "head_dim must be a multiple of 8, at most 256");
  TORCH_CHECK(k_cache.size(2) == D && Hkv > 0 && H % Hkv == 0, "cache heads/head_dim do not match q");
  TORCH_CHECK(block_size > 0 && k_cache.size(0) % block_size == 0, "cache slots must be whole blocks");
  for (const auto* t : {&block_tables, &q_starts, &q_lens, &kv_lens})
    TORCH_CHECK(t->dtype() == torch::kInt64 && t->is_contiguous() && t->device().is_cpu(), "paged_attention: index tensors must be int64 CPU");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && q_starts.numel() == B && kv_lens.numel() == B,
              "paged_attention: one table, start and length per sequence");
  const int64_t group = H / Hkv, max_blocks = block_tables.size(1), VD = D / 8;
  {
    const int64_t num_blocks = k_cache.size(0) / block_size;
    const int64_t* bt0 = block_tables.data_ptr<int64_t>();
    const int64_t *qs0 = q_starts.data_ptr<int64_t>(), *ql0 = q_lens.data_ptr<int64_t>(), *kl0 = kv_lens.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(ql0[b] >= 0 && qs0[b] >= 0 && qs0[b] + ql0[b] <= T && ql0[b] <= kl0[b],
                  "paged_attention: sequence ", b, " has query rows [", qs0[b], ", +", ql0[b], ") of ", T, " and ", kl0[b], " keys");
      const int64_t used = (kl0[b] + block_size - 1) / block_size;
      TORCH_CHECK(used <= max_blocks, "paged_attention: sequence ", b, " needs ", used, " blocks, its table has ", max_blocks);
      for (int64_t j = 0; j < used; ++j)
        TORCH_CHECK(bt0[b * max_blocks + j] >= 0 && bt0[b * max_blocks + j] < num_blocks,
                    "paged_attention: block ", bt0[b * max_blocks + j], " of sequence ", b, " is outside the cache");
    }
  }
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
        // Walk the block table block by block (no division per key).
        for (int64_t j0 = 0, blk = 0; j0 < n; j0 += block_size, ++blk) {
          const float* kblock = kp + (table[blk] * block_size * Hkv + kvh) * D;
          const int64_t m = std::min(block_size, n - j0);
          const int64_t stride = Hkv * D;
          int64_t o = 0;
          // Four keys at a time: one key's dot product is a chain of dependent FMAs, so a lone key
          // waits on latency; four independent chains fill the pipes. Each score is still summed in
          // the same order as one key alone (same bits).
          for (; o + 4 <= m; o += 4) {
            const float* k0 = kblock + o * stride;
            __m256 a0 = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(k0));
            __m256 a1 = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(k0 + stride));
            __m256 a2 = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(k0 + 2 * stride));
            __m256 a3 = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(k0 + 3 * stride));
            for (int64_t d = 1; d < VD; ++d) {
              a0 = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(k0 + 8 * d), a0);
              a1 = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(k0 + stride + 8 * d), a1);
              a2 = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(k0 + 2 * stride + 8 * d), a2);
              a3 = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(k0 + 3 * stride + 8 * d), a3);
            }
            float* sc = scores.data() + j0 + o;
            sc[0] = hsum(a0); sc[1] = hsum(a1); sc[2] = hsum(a2); sc[3] = hsum(a3);
            mx = std::max(mx, std::max(std::max(sc[0], sc[1]), std::max(sc[2], sc[3])));
          }
          for (; o < m; ++o) {
            const float* kv = kblock + o * stride;
            __m256 acc = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(kv));
            for (int64_t d = 1; d < VD; ++d) acc = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(kv + 8 * d), acc);
            scores[j0 + o] = hsum(acc);
            mx = std::max(mx, scores[j0 + o]);
          }
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
        for (int64_t j0 = 0, blk = 0; j0 < n; j0 += block_size, ++blk) {
          const float* vblock = vp + (table[blk] * block_size * Hkv + kvh) * D;
          const int64_t m = std::min(block_size, n - j0);
          for (int64_t u = 0; u < m; ++u) {
            const float* vv = vblock + u * Hkv * D;
            const __m256 p = _mm256_set1_ps(scores[j0 + u]);
            for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vv + 8 * d), o[d]);
          }
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sum);
        float* ov = op + (t * H + h) * D;
        for (int64_t d = 0; d < VD; ++d) _mm256_storeu_ps(ov + 8 * d, _mm256_mul_ps(o[d], inv));
      }
    }
  });
  return out;
}

}  // namespace specserve
