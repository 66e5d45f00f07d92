// The int8 VNNI kernel (run_vnni) timed alone on one thread over random packed blocks: type, rows M, K, N
// from the command line; the best of 20 runs in GMAC/s (bench/q8_harness/run.sh builds it).
#include "ops.h"
#include "q8_blocks.h"
#include <chrono>
#include <cstdio>
#include <random>
using namespace specserve;
using namespace specserve::q8;
int main(int argc, char** argv) {
  int t = atoi(argv[1]); int64_t M = atoi(argv[2]); int64_t N = 1536, K = argc > 3 ? atoi(argv[3]) : 1536; int reps = 20;
  if (argc > 4) N = atoi(argv[4]);
  std::mt19937 rng(1);
  const int elems = gguf::block_elems(t), bytes = gguf::block_bytes(t);
  int64_t groups = N / 16, nb = K / elems;
  std::vector<uint8_t> packed(groups * nb * 16 * bytes);
  for (auto& b : packed) b = rng() & 0xFF;
  // sane fp16 scales: zero out exponent bits mostly -> just keep random; results irrelevant
  std::vector<float> x(M * K); for (auto& v : x) v = (rng() % 2000) / 1000.0f - 1.0f;
  std::vector<int8_t> q(M * K); std::vector<float> d(M * K / 32), xs(M * K / 32); std::vector<int32_t> s16(M * K / 16);
  for (int64_t r = 0; r < M; ++r) quantize_row_avx2(x.data() + r * K, K, RowOut{q.data() + r * K, d.data() + r * K / 32, s16.data() + r * K / 16, xs.data() + r * K / 32});
  Acts a{q.data(), d.data(), s16.data(), xs.data(), K};
  std::vector<float> y(M * N);
  PSeg seg{packed.data(), t, N, 0};
  PCall c{&seg, 1, a, y.data(), M, K, N};
  double best = 1e9;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run_vnni(c, 0, 0, groups);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double macs = double(M) * N * K;
  float chk = 0; for (float v : y) chk += v;
  printf("type %d M=%ld K=%ld N=%ld: %.3f ms  %.1f GMAC/s (chk %g)\n", t, M, K, N, best * 1e3, macs / best / 1e9, chk);
}
