// Paged attention for short query spans (decode tokens, verify spans, prefill chunks of up to 16
// rows), straight from the KV blocks.
#include "ops.h"

#include <type_traits>

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
// The caches are f32 (exact) or f16 (half the bytes to read; --kv-cache-dtype float16): every key
// and value is widened to f32 as it is loaded, and all arithmetic stays f32, so an f16 cache gives the
// bits of an f32 cache holding the same f16-rounded values.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// The most queries (span rows x heads of a group) one work item serves (each keeps a row of scores).
constexpr int64_t kMaxQueries = 32;

at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                           at::Tensor block_tables, at::Tensor q_starts, at::Tensor q_lens,
                           at::Tensor kv_lens, int64_t block_size, double scale,
                           c10::optional<at::Tensor> span_lens, c10::optional<at::Tensor> tree_mask,
                           int64_t window) {
  // Every index the loops below follow is checked first: a bad table or length raises here instead
  // of reading or writing outside the cache (O(sequences + blocks), nothing next to the attention).
  TORCH_CHECK(q.dtype() == at::kFloat && q.is_contiguous() && q.dim() == 3, "q must be contiguous f32 [T, H, D]");
  TORCH_CHECK((k_cache.dtype() == at::kFloat || k_cache.dtype() == at::kHalf) && v_cache.dtype() == k_cache.dtype()
              && k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3
              && v_cache.sizes() == k_cache.sizes(),
              "k_cache/v_cache must be contiguous f32 or f16 [slots, Hkv, D] of one shape and type");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(1), B = q_lens.size(0);
  TORCH_CHECK(D % 8 == 0 && D <= 256, "head_dim must be a multiple of 8, at most 256");
  TORCH_CHECK(k_cache.size(2) == D && Hkv > 0 && H % Hkv == 0, "cache heads/head_dim do not match q");
  TORCH_CHECK(block_size > 0 && k_cache.size(0) % block_size == 0, "cache slots must be whole blocks");
  for (const auto* t : {&block_tables, &q_starts, &q_lens, &kv_lens})
    TORCH_CHECK(t->dtype() == at::kLong && t->is_contiguous() && t->device().is_cpu(), "paged_attention: index tensors must be int64 CPU");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && q_starts.numel() == B && kv_lens.numel() == B,
              "paged_attention: one table, start and length per sequence");
  const int64_t group = H / Hkv, max_blocks = block_tables.size(1);
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
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* qs = q_starts.data_ptr<int64_t>();
  const int64_t* ql = q_lens.data_ptr<int64_t>();
  const int64_t* kl = kv_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  // Work items: a sequence's queries of one KV head (its span's rows x the heads of the group), cut
  // into parts of at most kMaxQueries so that there are items for every thread. The queries of an
  // item read each key and value row once, from L1, where one item per (sequence, head) read the
  // whole context again for every head of the group and every row of the span (a prefill chunk's 16
  // rows x 7 heads on Qwen2.5-0.5B). Each output is still summed in the same order, whatever the item
  // it falls in: the bits do not depend on the parts, the span or the batch.
  struct Item { int64_t b, kvh, r0, r1; };
  std::vector<Item> items;
  {
    const int64_t target = at::get_num_threads();  // items for every thread; more would read the keys again
    int64_t pairs = 0;
    for (int64_t b = 0; b < B; ++b) pairs += ql[b] > 0 ? Hkv : 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t R = ql[b] * group;
      if (R == 0) continue;
      int64_t parts = std::max((R + kMaxQueries - 1) / kMaxQueries, (target + pairs - 1) / std::max<int64_t>(pairs, 1));
      parts = std::min(parts, R);
      for (int64_t kvh = 0; kvh < Hkv; ++kvh)
        for (int64_t p = 0; p < parts; ++p) items.push_back({b, kvh, p * R / parts, (p + 1) * R / parts});
    }
  }
  at::parallel_for(0, (int64_t)items.size(), 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores, qbuf, obuf;  // per query of the item: its scores, scaled q, running output
    std::vector<int64_t> span_pos;  // per query: the positions of the tree rows it sees
    struct Query { int64_t t, h, n_ctx, vis, lo, nc, n; float mx, sum; };
    std::vector<Query> qr;
    const int64_t stride = Hkv * D;
    // VD (D / 8) a constant for the head sizes of the real models (64, 128, 256): the loops over it
    // unroll. KT: the cache's element, float or f16 (uint16_t bits, widened by load8).
    auto run = [&](auto vd, const auto* kp, const auto* vp, const Item it) {
      const int64_t VD = vd;
      using KT = std::remove_cv_t<std::remove_pointer_t<decltype(kp)>>;
      const int64_t b = it.b, kvh = it.kvh, nq = it.r1 - it.r0;
      const int64_t* table = bt + b * max_blocks;
      const int64_t span = trees ? sl[b] : 0;
      qr.resize(nq);
      qbuf.resize(nq * D);
      obuf.assign(nq * D, 0.0f);
      span_pos.resize(nq * (Lmax + 1));
      int64_t jlo = INT64_MAX, jhi = 0;  // the context keys any query of the item sees
      int64_t sstride = 1;  // a score row: the most keys one of the item's queries sees (at least 1)
      for (int64_t r = 0; r < nq; ++r) {
        // query r of the item: row i of the span, head h of the group
        const int64_t i = (it.r0 + r) / group, h = kvh * group + (it.r0 + r) % group, t = qs[b] + i;
        // keys this query sees: n_ctx in a row (the blocked loops below), then, in a tree, the span
        // rows its mask keeps (one by one); span_pos[e] is the e-th one's position
        Query& x = qr[r];
        x.t = t; x.h = h;
        x.n_ctx = span ? kl[b] - span : kl[b] - ql[b] + i + 1;
        x.vis = 0;  // tree rows seen: the query's depth + 1
        if (span) {
          const uint8_t* row = tm + t * Lmax;
          for (int64_t a = 0; a < span; ++a)
            if (row[a]) span_pos[r * (Lmax + 1) + x.vis++] = x.n_ctx + a;
        }
        // the first context key in the window of a query at position n_ctx + vis - 1
        x.lo = window > 0 ? std::max<int64_t>(0, x.n_ctx + x.vis - window) : 0;
        x.nc = x.n_ctx - x.lo; x.n = x.nc + x.vis;  // scores: the context's in the window, then the tree's
        x.mx = -INFINITY;
        const float* qv = qp + (t * H + h) * D;
        for (int64_t d = 0; d < VD; ++d)
          _mm256_storeu_ps(&qbuf[r * D + 8 * d], _mm256_mul_ps(_mm256_loadu_ps(qv + 8 * d), _mm256_set1_ps(scale)));
        jlo = std::min(jlo, x.lo);
        jhi = std::max(jhi, x.n_ctx);
        sstride = std::max(sstride, x.n);
      }
      scores.resize(nq * sstride);
      // One key's score: a chain of dependent FMAs over d, then the horizontal sum. Every score is
      // summed in this order, alone or in the four-key and two-query loops below (same bits).
      auto dot1 = [&](const float* qv, const KT* kv) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qv), load8(kv));
        for (int64_t d = 1; d < VD; ++d) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qv + 8 * d), load8(kv + 8 * d), acc);
        return hsum(acc);
      };
      // o += p * v: a query's output gathers its keys' values in position order.
      auto accumulate = [&](__m256* o, float p, const KT* vv) {
        const __m256 pv = _mm256_set1_ps(p);
        for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_fmadd_ps(pv, load8(vv + 8 * d), o[d]);
      };
      // Query r's scores of the context keys [a, e) of the run that starts at key j0 (its rows at
      // kblock): sc[j - lo] is key j's. Four keys at a time: one key's dot product is a chain of
      // dependent FMAs, so a lone key waits on latency; independent chains fill the pipes.
      auto score_one = [&](int64_t r, const KT* kblock, int64_t j0, int64_t a, int64_t e) {
        Query& x = qr[r];
        const float* qv = &qbuf[r * D];
        float* sc = scores.data() + r * sstride + (a - x.lo);  // sc[j - a]: key j's score
        float mx = x.mx;
        int64_t j = a;
        for (; j + 4 <= e; j += 4) {
          const KT* k0 = kblock + (j - j0) * stride;
          const __m256 q0 = _mm256_loadu_ps(qv);
          __m256 a0 = _mm256_mul_ps(q0, load8(k0));
          __m256 a1 = _mm256_mul_ps(q0, load8(k0 + stride));
          __m256 a2 = _mm256_mul_ps(q0, load8(k0 + 2 * stride));
          __m256 a3 = _mm256_mul_ps(q0, load8(k0 + 3 * stride));
          for (int64_t d = 1; d < VD; ++d) {
            const __m256 qd = _mm256_loadu_ps(qv + 8 * d);
            a0 = _mm256_fmadd_ps(qd, load8(k0 + 8 * d), a0);
            a1 = _mm256_fmadd_ps(qd, load8(k0 + stride + 8 * d), a1);
            a2 = _mm256_fmadd_ps(qd, load8(k0 + 2 * stride + 8 * d), a2);
            a3 = _mm256_fmadd_ps(qd, load8(k0 + 3 * stride + 8 * d), a3);
          }
          float* s4 = sc + (j - a);
          s4[0] = hsum(a0); s4[1] = hsum(a1); s4[2] = hsum(a2); s4[3] = hsum(a3);
          mx = std::max(mx, std::max(std::max(s4[0], s4[1]), std::max(s4[2], s4[3])));
        }
        for (; j < e; ++j) {
          sc[j - a] = dot1(qv, kblock + (j - j0) * stride);
          mx = std::max(mx, sc[j - a]);
        }
        x.mx = mx;
      };
      // Queries r and r + 1 over the same keys [a, e): eight chains (two queries x four keys), each
      // key row loaded once for both.
      auto score_two = [&](int64_t r, const KT* kblock, int64_t j0, int64_t a, int64_t e) {
        Query &x = qr[r], &y = qr[r + 1];
        const float *qv = &qbuf[r * D], *qw = qv + D;
        float* sc = scores.data() + r * sstride + (a - x.lo);
        float* sd = scores.data() + (r + 1) * sstride + (a - y.lo);
        float mx = x.mx, my = y.mx;
        int64_t j = a;
        for (; j + 4 <= e; j += 4) {
          const KT* k0 = kblock + (j - j0) * stride;
          __m256 k = load8(k0);
          const __m256 q0 = _mm256_loadu_ps(qv), w0 = _mm256_loadu_ps(qw);
          __m256 a0 = _mm256_mul_ps(q0, k), b0 = _mm256_mul_ps(w0, k);
          k = load8(k0 + stride);
          __m256 a1 = _mm256_mul_ps(q0, k), b1 = _mm256_mul_ps(w0, k);
          k = load8(k0 + 2 * stride);
          __m256 a2 = _mm256_mul_ps(q0, k), b2 = _mm256_mul_ps(w0, k);
          k = load8(k0 + 3 * stride);
          __m256 a3 = _mm256_mul_ps(q0, k), b3 = _mm256_mul_ps(w0, k);
          for (int64_t d = 1; d < VD; ++d) {
            const __m256 qd = _mm256_loadu_ps(qv + 8 * d), wd = _mm256_loadu_ps(qw + 8 * d);
            k = load8(k0 + 8 * d);
            a0 = _mm256_fmadd_ps(qd, k, a0); b0 = _mm256_fmadd_ps(wd, k, b0);
            k = load8(k0 + stride + 8 * d);
            a1 = _mm256_fmadd_ps(qd, k, a1); b1 = _mm256_fmadd_ps(wd, k, b1);
            k = load8(k0 + 2 * stride + 8 * d);
            a2 = _mm256_fmadd_ps(qd, k, a2); b2 = _mm256_fmadd_ps(wd, k, b2);
            k = load8(k0 + 3 * stride + 8 * d);
            a3 = _mm256_fmadd_ps(qd, k, a3); b3 = _mm256_fmadd_ps(wd, k, b3);
          }
          float *s4 = sc + (j - a), *t4 = sd + (j - a);
          s4[0] = hsum(a0); s4[1] = hsum(a1); s4[2] = hsum(a2); s4[3] = hsum(a3);
          t4[0] = hsum(b0); t4[1] = hsum(b1); t4[2] = hsum(b2); t4[3] = hsum(b3);
          mx = std::max(mx, std::max(std::max(s4[0], s4[1]), std::max(s4[2], s4[3])));
          my = std::max(my, std::max(std::max(t4[0], t4[1]), std::max(t4[2], t4[3])));
        }
        x.mx = mx; y.mx = my;
        score_one(r, kblock, j0, j, e);
        score_one(r + 1, kblock, j0, j, e);
      };
      // Walk the block table block by block over the item's keys (no division per key): each run of
      // a block's keys is scored by every query that sees them while the run is in L1.
      auto m_of = [&](int64_t j0) { return std::min(block_size - j0 % block_size, jhi - j0); };
      auto slot = [&](int64_t pos) { return (table[pos / block_size] * block_size + pos % block_size) * stride + kvh * D; };
      // The next block lies anywhere in the cache, where the hardware prefetcher does not follow: its
      // rows are asked for while this block's are worked on (decode steps read the context from DRAM).
      auto prefetch_run = [&](const KT* rows, int64_t m) {
        for (int64_t u = 0; u < m; ++u)
          for (int64_t c = 0; c < D; c += 64 / (int64_t)sizeof(KT))
            _mm_prefetch(reinterpret_cast<const char*>(rows + u * stride + c), _MM_HINT_T0);
      };
      for (int64_t j0 = jlo; j0 < jhi; j0 += m_of(j0)) {
        const KT* kblock = kp + slot(j0);
        const int64_t j1 = j0 + m_of(j0);
        if (j1 < jhi) prefetch_run(kp + slot(j1), m_of(j1));
        for (int64_t r = 0; r < nq;) {
          const int64_t a = std::max(j0, qr[r].lo), e = std::min(j1, qr[r].n_ctx);
          if (r + 1 == nq) {
            if (a < e) score_one(r, kblock, j0, a, e);
            break;
          }
          // the keys both see in pairs; a window's or a causal span's edge one by one
          const int64_t a2 = std::max(j0, qr[r + 1].lo), e2 = std::min(j1, qr[r + 1].n_ctx);
          const int64_t ca = std::max(a, a2), ce = std::min(e, e2);
          if (ca < ce) {
            if (a < ca) score_one(r, kblock, j0, a, ca);
            if (a2 < ca) score_one(r + 1, kblock, j0, a2, ca);
            score_two(r, kblock, j0, ca, ce);
            if (ce < e) score_one(r, kblock, j0, ce, e);
            if (ce < e2) score_one(r + 1, kblock, j0, ce, e2);
          } else {
            if (a < e) score_one(r, kblock, j0, a, e);
            if (a2 < e2) score_one(r + 1, kblock, j0, a2, e2);
          }
          r += 2;
        }
      }
      for (int64_t r = 0; r < nq; ++r) {
        Query& x = qr[r];
        float* sr = &scores[r * sstride];
        for (int64_t e = x.nc; e < x.n; ++e) {  // a tree's visible span rows, one by one
          sr[e] = dot1(&qbuf[r * D], kp + slot(span_pos[r * (Lmax + 1) + e - x.nc]));
          x.mx = std::max(x.mx, sr[e]);
        }
        const int64_t n = x.n;
        const __m256 vmx = _mm256_set1_ps(x.mx);
        __m256 vsum = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
          __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sr + j), vmx));
          _mm256_storeu_ps(sr + j, e);
          vsum = _mm256_add_ps(vsum, e);
        }
        float sum = hsum(vsum);
        if (j < n) {  // the tail, padded with -inf so exp gives 0
          float tail[8];
          for (int64_t u = 0; u < 8; ++u) tail[u] = j + u < n ? sr[j + u] - x.mx : -INFINITY;
          __m256 e = exp256(_mm256_loadu_ps(tail));
          _mm256_storeu_ps(tail, e);
          for (int64_t u = 0; j + u < n; ++u) { sr[j + u] = tail[u]; sum += tail[u]; }
        }
        x.sum = sum;
      }
      // The values, in the same runs: each query's output gathers its keys in position order.
      for (int64_t j0 = jlo; j0 < jhi; j0 += m_of(j0)) {
        const KT* vblock = vp + slot(j0);
        const int64_t j1 = j0 + m_of(j0);
        if (j1 < jhi) prefetch_run(vp + slot(j1), m_of(j1));
        for (int64_t r = 0; r < nq; ++r) {
          const Query& x = qr[r];
          const int64_t a = std::max(j0, x.lo), e = std::min(j1, x.n_ctx);
          if (a >= e) continue;
          const float* pr = scores.data() + r * sstride;  // pr[u - lo]: key u's weight
          float* orow = &obuf[r * D];
          __m256 o[32];
          for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_loadu_ps(orow + 8 * d);
          for (int64_t u = a; u < e; ++u) accumulate(o, pr[u - x.lo], vblock + (u - j0) * stride);
          for (int64_t d = 0; d < VD; ++d) _mm256_storeu_ps(orow + 8 * d, o[d]);
        }
      }
      for (int64_t r = 0; r < nq; ++r) {
        const Query& x = qr[r];
        const float* sr = &scores[r * sstride];
        float* orow = &obuf[r * D];
        __m256 o[32];
        for (int64_t d = 0; d < VD; ++d) o[d] = _mm256_loadu_ps(orow + 8 * d);
        for (int64_t e = x.nc; e < x.n; ++e) accumulate(o, sr[e], vp + slot(span_pos[r * (Lmax + 1) + e - x.nc]));
        const __m256 inv = _mm256_set1_ps(1.0f / x.sum);
        float* ov = op + (x.t * H + x.h) * D;
        for (int64_t d = 0; d < VD; ++d) _mm256_storeu_ps(ov + 8 * d, _mm256_mul_ps(o[d], inv));
      }
    };
    // f16 caches hold the bits of f16 values; their widening to f32 is exact
    const bool half = k_cache.scalar_type() == at::kHalf;
    auto typed = [&](auto vd, const Item& it) {
      if (half)
        run(vd, reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::Half>()),
            reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::Half>()), it);
      else
        run(vd, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), it);
    };
    for (int64_t w = w0; w < w1; ++w) {
      switch (D) {
        case 64: typed(std::integral_constant<int64_t, 8>{}, items[w]); break;
        case 128: typed(std::integral_constant<int64_t, 16>{}, items[w]); break;
        case 256: typed(std::integral_constant<int64_t, 32>{}, items[w]); break;
        default: typed(D / 8, items[w]);
      }
    }
  });
  return out;
}

}  // namespace specserve
