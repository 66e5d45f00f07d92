// The int8-activation build for CPUs with AVX-VNNI and without AVX-512 VNNI (Intel's cores since Alder
// Lake and the Xeons of E-cores): the AVX2 build's code (q8_avx2.h) with VEX-encoded VPDPBUSD adding 4
// products into each 32-bit lane, in place of VPMADDUBSW's 16-bit pairs and their widening.
//
// Written on CPUs without it: its code runs with the instruction emulated (build "avxvnni-emulated", in
// q8_matmul_avx2.cpp) in every test, and on a CPU with AVX-VNNI it becomes the default only after the
// start-up check (q8_matmul.cpp's agrees) gives the reference's bits with the real instruction.
#include "ops.h"
#include "q8_blocks.h"

#include <utility>  // before the pragma: no standard inline function is declared for avxvnni

#pragma GCC push_options
#pragma GCC target("avxvnni")

#include "q8_avx2.h"

namespace specserve {
namespace q8 {
namespace {

struct Vnni {
  static constexpr bool WIDE = true;
  static __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
};

}  // namespace

void run_avxvnni(const PCall& c, int seg, int64_t g0, int64_t g1) { run<Vnni>(c, seg, g0, g1); }

}  // namespace q8
}  // namespace specserve

#pragma GCC pop_options

namespace specserve {
namespace q8 {
bool cpu_has_avxvnni() { return __builtin_cpu_supports("avxvnni"); }
}  // namespace q8
}  // namespace specserve
