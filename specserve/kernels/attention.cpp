// Paged attention for short query spans (decode tokens, verify spans), straight from the KV blocks.
#include "ops.h"

namespace specserve {

// q [T, H, D]; caches [slots, Hkv, D]; block_tables [B, max_blocks]; per sequence: first row in q,
// number of new tokens, context length (new tokens included). Sequence b's query i sits at position
// kv_len - q_len + i and attends to keys 0..that position. D must be a multiple of 8.
//
// Token trees (span_lens [B], tree_mask [T, Lmax] uint8, both or neither): sequence b's last
// span_lens[b] keys are a tree's rows (span_lens[b] >= q_lens[b]; 0: a causal sequence). Query row t
// sees every key before the span and the span rows a with tree_mask[t][a] set (itself and its
// ancestors). The keys it sees are scored into one compact row in position order, so a tree node's
// output has the same bits as the last row of a causal span made of its path.
//
// Sliding-window layers (window > 0, Gemma / Mistral style): the query at position p sees keys
// p - window + 1 .. p only. A verify row and the one-token step at its position read the same keys
// in the same order, so they still give the same bits. A tree node sits at position (context length
// + its depth), so its window starts there; a tree must be shorter than the window.
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                           at::Tensor block_tables, at::Tensor q_starts, at::Tensor q_lens,
                           at::Tensor kv_lens, int64_t block_size, double scale,
                           c10::optional<at::Tensor> span_lens, c10::optional<at::Tensor> tree_mask,
                           int64_t window) {
  // Every index the loops below follow is checked first: a bad table or length raises here instead
  // of reading or writing outside the cache (O(sequences + blocks), nothing next to the attention).
  TORCH_CHECK(q.dtype() == at::kFloat && q.is_contiguous() && q.dim() == 3, "q must be contiguous f32 [T, H, D]");
  TORCH_CHECK(k_cache.dtype() == at::kFloat && v_cache.dtype() == at::kFloat && k_cache.is_contiguous()
              && v_cache.is_contiguous() && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(),
              "k_cache/v_cache must be contiguous f32 [slots, Hkv, D] of one shape");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(1), B = q_lens.size(0);
  TORCH_CHECK(D % 8 == 0 && D <= 256, "head_dim must be a multiple of 8, at most 256");
  TORCH_CHECK(k_cache.size(2) == D && Hkv > 0 && H % Hkv == 0, "cache heads/head_dim do not match q");
  TORCH_CHECK(block_size > 0 && k_cache.size(0) % block_size == 0, "cache slots must be whole blocks");
  for (const auto* t : {&block_tables, &q_starts, &q_lens, &kv_lens})
    TORCH_CHECK(t->dtype() == at::kLong && t->is_contiguous() && t->device().is_cpu(), "paged_attention: index tensors must be int64 CPU");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && q_starts.numel() == B && kv_lens.numel() == B,
              "paged_attention: one table, start and length per sequence");
  const int64_t group = H / Hkv, max_blocks = block_tables.size(1), VD = D / 8;
  TORCH_CHECK(span_lens.has_value() == tree_mask.has_value(), "paged_attention: span_lens and tree_mask go together");
  const bool trees = span_lens.has_value();
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0");
  const int64_t* sl = nullptr;
  const uint8_t* tm = nullptr;
  int64_t Lmax = 0;
  if (trees) {
    TORCH_CHECK(span_lens->dtype() == at::kLong && span_lens->is_contiguous() && span_lens->numel() == B,
                "paged_attention: span_lens must be int64 [B]");
    TORCH_CHECK(tree_mask->dtype() == at::kByte && tree_mask->is_contiguous() && tree_mask->dim() == 2
                && tree_mask->size(0) == T, "paged_attention: tree_mask must be uint8 [T, Lmax]");
    sl = span_lens->data_ptr<int64_t>();
    tm = tree_mask->data_ptr<uint8_t>();
    Lmax = tree_mask->size(1);
  }
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
      if (trees)
        TORCH_CHECK(sl[b] == 0 || (sl[b] >= ql0[b] && sl[b] <= kl0[b] && sl[b] <= Lmax && (window == 0 || sl[b] <= window)),
                    "paged_attention: sequence ", b, " has a tree span of ", sl[b], " rows for ", ql0[b],
                    " queries, ", kl0[b], " keys and a mask of ", Lmax, " columns");
    }
  }
  auto out = at::empty_like(q);
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
    std::vector<int64_t> span_pos(Lmax + 1);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / H, h = w % H, kvh = h / group;
      const int64_t* table = bt + b * max_blocks;
      for (int64_t i = 0; i < ql[b]; ++i) {
        const int64_t t = qs[b] + i;
        const int64_t span = trees ? sl[b] : 0;
        // keys this query sees: n_ctx in a row (the blocked loops below), then, in a tree, the span
        // rows its mask keeps (one by one); span_pos[e] is the e-th one's position
        const int64_t n_ctx = span ? kl[b] - span : kl[b] - ql[b] + i + 1;
        int64_t vis = 0;  // tree rows seen: the query's depth + 1
        if (span) {
          const uint8_t* row = tm + t * Lmax;
          for (int64_t a = 0; a < span; ++a)
            if (row[a]) span_pos[vis++] = n_ctx + a;
        }
        // the first context key in the window of a query at position n_ctx + vis - 1
        const int64_t lo = window > 0 ? std::max<int64_t>(0, n_ctx + vis - window) : 0;
        const int64_t nc = n_ctx - lo, n = nc + vis;  // scores: the context's in the window, then the tree's
        // keys of block-aligned runs: from j0 to the end of its block or of the context
        auto m_of = [&](int64_t j0) { return std::min(block_size - j0 % block_size, n_ctx - j0); };
        const float* qv = qp + (t * H + h) * D;
        __m256 qreg[32];
        for (int64_t d = 0; d < VD; ++d) qreg[d] = _mm256_mul_ps(_mm256_loadu_ps(qv + 8 * d), _mm256_set1_ps(scale));
        float mx = -INFINITY;
        // Walk the block table block by block from the first key in the window (no division per key);
        // scores[e] is key lo + e.
        for (int64_t j0 = lo, blk = lo / block_size; j0 < n_ctx; j0 += m_of(j0), ++blk) {
          const int64_t off = j0 - blk * block_size;
          const float* kblock = kp + ((table[blk] * block_size + off) * Hkv + kvh) * D;
          const int64_t m = m_of(j0);
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
            float* sc = scores.data() + j0 - lo + o;
            sc[0] = hsum(a0); sc[1] = hsum(a1); sc[2] = hsum(a2); sc[3] = hsum(a3);
            mx = std::max(mx, std::max(std::max(sc[0], sc[1]), std::max(sc[2], sc[3])));
          }
          for (; o < m; ++o) {
            const float* kv = kblock + o * stride;
            __m256 acc = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(kv));
            for (int64_t d = 1; d < VD; ++d) acc = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(kv + 8 * d), acc);
            scores[j0 - lo + o] = hsum(acc);
            mx = std::max(mx, scores[j0 - lo + o]);
          }
        }
        for (int64_t e = nc; e < n; ++e) {  // a tree's visible span rows, one by one
          const int64_t pos = span_pos[e - nc];
          const float* kv = kp + ((table[pos / block_size] * block_size + pos % block_size) * Hkv + kvh) * D;
          __m256 acc = _mm256_mul_ps(qreg[0], _mm256_loadu_ps(kv));
          for (int64_t d = 1; d < VD; ++d) acc = _mm256_fmadd_ps(qreg[d], _mm256_loadu_ps(kv + 8 * d), acc);
          scores[e] = hsum(acc);
          mx = std::max(mx, scores[e]);
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
        for (int64_t j0 = lo, blk = lo / block_size; j0 < n_ctx; j0 += m_of(j0), ++blk) {
          const float* vblock = vp + ((table[blk] * block_size + j0 - blk * block_size) * Hkv + kvh) * D;
          const int64_t m = m_of(j0);
          for (int64_t u = 0; u < m; ++u) {
            const float* vv = vblock + u * Hkv * D;
            const __m256 p = _mm256_set1_ps(scores[j0 - lo + u]);
            for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vv + 8 * d), o[d]);
          }
        }
        for (int64_t e = nc; e < n; ++e) {
          const int64_t pos = span_pos[e - nc];
          const float* vv = vp + ((table[pos / block_size] * block_size + pos % block_size) * Hkv + kvh) * D;
          const __m256 p = _mm256_set1_ps(scores[e]);
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

}  // namespace specserve
