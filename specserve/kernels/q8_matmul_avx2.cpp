// The int8-activation build for AVX2 CPUs without VNNI (the AVX2-only EPYCs): VPMADDUBSW's pairs added
// in 16 bits and widened by VPMADDWD with ones in place of VPDPBUSD (the body: q8_avx2.h). Beside it,
// the AVX-VNNI build's code with VPDPBUSD emulated exactly, so that build is tested on any AVX2 CPU
// (q8_matmul_avxvnni.cpp runs the same code with the instruction).
#include "ops.h"
#include "q8_blocks.h"
#include "q8_avx2.h"

namespace specserve {
namespace q8 {
namespace {

struct Maddubs {  // pairs of products in 16 bits, widened by the caller (widen)
  static constexpr bool WIDE = false;
  static __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s)); }
};

// VPDPBUSD's integers without it: u's bytes and s's signed bytes widened to 16 bits, even and odd bytes
// apart, and VPMADDWD's pair sums (exact: at most 2 x 255 x 128) added into the 32-bit lane.
struct VnniEmulated {
  static constexpr bool WIDE = true;
  static __m256i dot(__m256i acc, __m256i u, __m256i s) {
    const __m256i even = _mm256_madd_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x00FF)),
                                           _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8));
    const __m256i odd = _mm256_madd_epi16(_mm256_srli_epi16(u, 8), _mm256_srai_epi16(s, 8));
    return _mm256_add_epi32(acc, _mm256_add_epi32(even, odd));
  }
};

}  // namespace

void run_avx2(const PCall& c, int seg, int64_t g0, int64_t g1) { run<Maddubs>(c, seg, g0, g1); }
void run_avxvnni_emulated(const PCall& c, int seg, int64_t g0, int64_t g1) { run<VnniEmulated>(c, seg, g0, g1); }

}  // namespace q8
}  // namespace specserve
