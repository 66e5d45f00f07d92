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
// This file holds the AVX2 build (each block decoded once per row tile into a small buffer, then 8-lane
// FMAs per row) and the entry points; gguf_matmul_avx512.cpp decodes in registers where the CPU has
// AVX-512. Threads split the output columns.
#include "ops.h"
#include "gguf_blocks.h"

namespace specserve {
namespace gguf {
namespace {

constexpr int MAX_TILE_ROWS = 8;  // R accumulators + 4 weight vectors + a partial product: 13 registers
constexpr int64_t GROUP = 16;     // output columns whose weights stay in cache while every row tile reads them

template <int R, int T>
void column(const Segment& s, int64_t col, const float* x, int64_t K, float* y, int64_t N, int64_t r0) {
  const int elems = block_elems(T), bytes = block_bytes(T);
  const uint8_t* row = s.data + col * s.row_bytes;
  alignas(32) float w[256];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < K / elems; ++b) {
    decode_block_t<T>(row + b * bytes, w);
    for (int c = 0; c < elems; c += 32) {
      const __m256 w0 = _mm256_load_ps(w + c), w1 = _mm256_load_ps(w + c + 8);
      const __m256 w2 = _mm256_load_ps(w + c + 16), w3 = _mm256_load_ps(w + c + 24);
      for (int r = 0; r < R; ++r) {
        const float* xb = x + (r0 + r) * K + b * elems + c;
        __m256 t = _mm256_mul_ps(w0, _mm256_loadu_ps(xb));
        t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), t);
        t = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), t);
        t = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), t);
        acc[r] = _mm256_add_ps(acc[r], t);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[(r0 + r) * N + s.first + col] = hsum(acc[r]);
}

template <int R, int T>
void columns(const Segment& s, int64_t c0, int64_t c1, const Call& c, int64_t r0) {
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

std::vector<gguf::Segment> segments(const std::vector<torch::Tensor>& raws, const std::vector<int64_t>& types,
                                    int64_t K) {
  TORCH_CHECK(!raws.empty() && raws.size() == types.size(), "gguf_linear: one type per weight segment");
  std::vector<gguf::Segment> segs;
  int64_t first = 0;
  for (size_t i = 0; i < raws.size(); ++i) {
    const torch::Tensor& r = raws[i];
    const int t = static_cast<int>(types[i]);
    const int elems = gguf::block_elems(t);
    TORCH_CHECK(elems > 0, "gguf_linear: GGML type ", t, " is not one the kernels take");
    TORCH_CHECK(r.dtype() == torch::kUInt8 && r.dim() == 2 && r.stride(1) == 1, "gguf_linear: raw blocks must be u8 [rows, bytes]");
    TORCH_CHECK(K % elems == 0 && r.size(1) == K / elems * gguf::block_bytes(t),
                "gguf_linear: a row of ", r.size(1), " bytes is not ", K, " elements of GGML type ", t);
    segs.push_back({r.data_ptr<uint8_t>(), t, r.size(0), r.stride(0), first});
    first += r.size(0);
  }
  return segs;
}

}  // namespace

torch::Tensor gguf_linear(torch::Tensor x, const std::vector<torch::Tensor>& raws, const std::vector<int64_t>& types) {
  // x: [M, K] f32; raws[i]: [N_i, bytes per row] u8 in GGML type types[i] -> y: [M, sum N_i] f32
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "x must be f32 [M, K]");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  const std::vector<gguf::Segment> segs = segments(raws, types, K);
  const int64_t N = segs.back().first + segs.back().rows;
  auto y = torch::empty({M, N}, x.options());
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

torch::Tensor gguf_dequantize_rows(torch::Tensor raw, int64_t type, torch::Tensor ids, int64_t K) {
  // raw: [N, bytes per row] u8; ids: [T] int64 -> [T, K] f32 (an embedding lookup, or the whole
  // table with ids = arange(N))
  const int t = static_cast<int>(type), elems = gguf::block_elems(t), bytes = gguf::block_bytes(t);
  TORCH_CHECK(elems > 0 && K % elems == 0 && raw.size(1) == K / elems * bytes, "gguf_dequantize_rows: bad type or width");
  TORCH_CHECK(ids.dtype() == torch::kInt64, "ids must be int64");
  ids = ids.contiguous();
  const int64_t T = ids.numel(), N = raw.size(0), stride = raw.stride(0);
  auto y = torch::empty({T, K}, torch::kFloat32);
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
