// An int8 kernel timed alone on one thread over random packed blocks: type, rows M, K, N and the build
// (vnni, avx2, avxvnni, avxvnni-emulated, amx, amx-emulated or amx-overhead; default vnni) from the command line; the best of 20 runs in GMAC/s,
// and for an AMX build whether its output has run_vnni's bits (bench/q8_harness/run.sh builds it). DUMP=path
// writes the output's bytes there, to compare two variants of one build.
#include "ops.h"
#include "q8_blocks.h"
#include <chrono>
#include <cstdio>
#include <random>
#include "kernel_amx.cpp"  // in this unit, so that its templates run with the Null unit below

namespace specserve {
namespace q8 {
namespace {
// A tile unit that does nothing: "amx-overhead" times the AMX build's own AVX-512 work (unpacking,
// storing and scaling the products) alone, the part of its time any CPU can measure.
struct Null {
  static void configure(const Config&) {}
  static void release() {}
  template <int T> static void load(const void*, int64_t) {}
  template <int T> static void zero() {}
  template <int T> static void store(void*, int64_t) {}
  template <int C, int B> static void dpbssd() {}
};
}  // namespace
}  // namespace q8
}  // namespace specserve
using namespace specserve;
using namespace specserve::q8;
int main(int argc, char** argv) {
  int t = atoi(argv[1]); int64_t M = atoi(argv[2]); int64_t N = 1536, K = argc > 3 ? atoi(argv[3]) : 1536; int reps = 20;
  if (argc > 4) N = atoi(argv[4]);
  const std::string build = argc > 5 ? argv[5] : "vnni";
  if (build == "amx" && !cpu_has_amx_int8()) {
    printf("type %d M=%ld: no AMX-INT8 on this CPU (or the OS refused it)\n", t, M);
    return 0;
  }
  using Fn = void (*)(const PCall&, int, int64_t, int64_t);
  if (build == "avxvnni" && !cpu_has_avxvnni()) {
    printf("type %d M=%ld: no AVX-VNNI on this CPU\n", t, M);
    return 0;
  }
  const Fn kernel = build == "amx" ? run_amx : build == "amx-emulated" ? run_amx_emulated : build == "amx-overhead" ? Fn(run<Null>)
                  : build == "avx2" ? Fn(run_avx2) : build == "avxvnni" ? Fn(run_avxvnni)
                  : build == "avxvnni-emulated" ? Fn(run_avxvnni_emulated) : Fn(run_vnni);
  if (build == "amx-emulated") reps = 1;
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
    kernel(c, 0, 0, groups);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (const char* path = getenv("DUMP")) {
    FILE* f = fopen(path, "wb");
    fwrite(y.data(), sizeof(float), y.size(), f);
    fclose(f);
  }
  double macs = double(M) * N * K;
  std::string same;
  if (build != "vnni" && build != "amx-overhead" && build != "avx2") {  // the bits of every output, NaNs from the random scales included
    std::vector<float> yv(M * N);
    PCall cv{&seg, 1, a, yv.data(), M, K, N};
    const bool vnni = cpu_has_vnni();  // else the AVX2 build's (the AVX-VNNI builds on an AVX2-only CPU)
    (vnni ? Fn(run_vnni) : Fn(run_avx2))(cv, 0, 0, groups);
    same = std::memcmp(y.data(), yv.data(), y.size() * 4) == 0 ? (vnni ? ", vnni's bits" : ", avx2's bits")
                                                               : (vnni ? ", NOT vnni's bits" : ", NOT avx2's bits");
  }
  printf("type %d M=%ld K=%ld N=%ld %s: %.3f ms  %.1f GMAC/s%s\n", t, M, K, N, build.c_str(), best * 1e3, macs / best / 1e9,
         same.c_str());
}
