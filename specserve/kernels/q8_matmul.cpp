// y = x @ W^T with 8-bit activations (the opt-in int8 mode; the formula is in q8_blocks.h): the packer,
// the plain reference over the file's own blocks, and the entry point that picks the build.
#include "ops.h"
#include "q8_blocks.h"

#include <algorithm>
#include <cstdio>

namespace specserve {
namespace q8 {
namespace {

// Column c's values of a packed group (16 file blocks side by side) written into one packed block of
// 16 * block_bytes(t) bytes: scales first, then the values as the VNNI build reads them, 64 bytes a
// vector, 4 bytes (one 32-bit lane) per column: see run_vnni for how each type's vectors are read.
void pack_block(int t, const uint8_t* const blocks[LANES], uint8_t* out) {
  auto put16 = [&](int off) {  // one fp16 per column, from byte `off` of its block
    for (int c = 0; c < LANES; ++c) std::memcpy(out + 2 * c, blocks[c] + off, 2);
    out += 2 * LANES;
  };
  auto put_lanes = [&](auto&& byte) {  // one 64-byte vector: byte(c, i) for column c, byte i of its lane
    for (int c = 0; c < LANES; ++c)
      for (int i = 0; i < 4; ++i) out[4 * c + i] = byte(c, i);
    out += 64;
  };
  const int elems = block_elems(t);
  uint8_t u[LANES][256];
  float ws, wm;
  const int G = sub_size(t);
  for (int c = 0; c < LANES; ++c)
    for (int s = 0; s < elems / G; ++s) sub_block(t, blocks[c], s, u[c] + G * s, &ws, &wm);
  switch (t) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
      const bool five = t == Q5_0 || t == Q5_1, mn = t == Q4_1 || t == Q5_1;
      put16(0);
      if (mn) put16(2);
      if (five) {  // 8 masks of 64 bits: step k's fifth bits, bit 4 c + i for element e(k, i)
        for (int k = 0; k < 8; ++k) {
          uint64_t m = 0;
          for (int c = 0; c < LANES; ++c)
            for (int i = 0; i < 4; ++i) {
              const int e = k < 4 ? 4 * k + i : 16 + 4 * (k - 4) + i;
              m |= static_cast<uint64_t>(u[c][e] >> 4) << (4 * c + i);
            }
          std::memcpy(out, &m, 8);
          out += 8;
        }
      }
      // vector k < 4: low nibbles elements 4k.., high nibbles 16 + 4k..
      for (int k = 0; k < 4; ++k) put_lanes([&](int c, int i) { return (u[c][4 * k + i] & 0xF) | (u[c][16 + 4 * k + i] & 0xF) << 4; });
      break;
    }
    case Q8_0:
      put16(0);
      for (int k = 0; k < 8; ++k) put_lanes([&](int c, int i) { return u[c][4 * k + i]; });
      break;
    case Q4_K:
      put16(0);
      put16(2);
      for (int w = 0; w < 3; ++w) put_lanes([&](int c, int i) { return blocks[c][4 + 4 * w + i]; });
      // (j, k): low nibbles sub-block 2 j elements 4 k.., high nibbles sub-block 2 j + 1
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 8; ++k) put_lanes([&](int c, int i) { return blocks[c][16 + 32 * j + 4 * k + i]; });
      break;
    case Q6_K:
      put16(208);
      for (int s = 0; s < 16; ++s)
        for (int c = 0; c < LANES; ++c) *out++ = blocks[c][192 + s];
      // per sub-block s: two vectors of low nibbles (steps 0, 1 and 2, 3), then (below) one of high bits
      for (int p = 0; p < 32; ++p) {
        const int s = p / 2, k = 2 * (p % 2);
        put_lanes([&](int c, int i) { return (u[c][16 * s + 4 * k + i] & 0xF) | (u[c][16 * s + 4 * k + 4 + i] & 0xF) << 4; });
      }
      for (int s = 0; s < 16; ++s)
        put_lanes([&](int c, int i) {
          int v = 0;
          for (int k = 0; k < 4; ++k) v |= (u[c][16 * s + 4 * k + i] >> 4) << (2 * k);
          return v;
        });
      break;
    default:
      break;
  }
}

struct Quantised {
  at::Tensor q, d, s16, xs;
  Acts acts() const {
    return {q.data_ptr<int8_t>(), d.data_ptr<float>(), s16.data_ptr<int32_t>(), xs.data_ptr<float>(), q.size(1)};
  }
};

// x's rows quantised (quantize_row; `plain`: the scalar loop the reference runs, else the AVX2 one of
// the same bits).
Quantised quantise(const at::Tensor& x, bool plain) {
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "int8 activations: K must be a multiple of 32");
  Quantised r{at::empty({M, K}, at::kChar), at::empty({M, K / 32}, at::kFloat),
              at::empty({M, K / 16}, at::kInt), at::empty({M, K / 32}, at::kFloat)};
  const float* px = x.data_ptr<float>();
  const Acts a = r.acts();
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const RowOut o{const_cast<int8_t*>(a.qr(i)), const_cast<float*>(a.dr(i)), const_cast<int32_t*>(a.sr(i)),
                     const_cast<float*>(a.xsr(i))};
      (plain ? quantize_row : quantize_row_avx2)(px + i * K, K, o);
    }
  });
  return r;
}

// The formula of q8_blocks.h, one output at a time, from the file's blocks.
float reference_one(int t, const uint8_t* row, const Acts& a, int64_t r, int64_t K) {
  const int elems = block_elems(t), bytes = block_bytes(t), G = sub_size(t), off = offset(t);
  const int8_t* q = a.qr(r);
  uint8_t u[32];
  float y = 0.0f, ws, wm;
  for (int64_t b = 0; b < K / elems; ++b)
    for (int s = 0; s < elems / G; ++s) {
      sub_block(t, row + b * bytes, s, u, &ws, &wm);
      const int64_t e0 = b * elems + s * G;
      int32_t isum = 0, qsum = 0;
      for (int e = 0; e < G; ++e) isum += u[e] * q[e0 + e];
      for (int h = 0; h < G / 16; ++h) qsum += a.sr(r)[e0 / 16 + h];
      isum -= off * qsum;
      y = std::fmaf(static_cast<float>(isum), ws * a.dr(r)[e0 / 32], y);
      if (has_min(t)) y = std::fmaf(wm, a.xsr(r)[e0 / 32], y);
    }
  return y;
}

// Whether a build gives the reference's bits on this CPU, for every type, over two groups and two row
// tiles of random blocks (finite scales). The AMX build must pass it before it becomes the default: it
// was written and tested with its tile unit emulated only (docs/decisions.md#amx-int8), so on a CPU
// where the real unit disagrees, VNNI stays and stderr says why.
using Run = void (*)(const PCall&, int, int64_t, int64_t);

bool agrees(Run run, const char* name) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const int64_t M = 20, K = 512, N = 2 * LANES;
  auto x = at::empty({M, K}, at::kFloat);
  for (int64_t i = 0; i < M * K; ++i) x.data_ptr<float>()[i] = (static_cast<float>(next() % 2001) - 1000.0f) / 250.0f;
  const Quantised qx = quantise(x, true);
  const Acts a = qx.acts();
  for (int t : {Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K}) {
    const int bytes = block_bytes(t);
    const int64_t nb = K / block_elems(t);
    std::vector<uint8_t> raw(N * nb * bytes), packed(N * nb * bytes);
    for (auto& b : raw) b = static_cast<uint8_t>(next());
    const std::vector<int> scales = t == Q6_K ? std::vector<int>{208} : has_min(t) ? std::vector<int>{0, 2} : std::vector<int>{0};
    for (int64_t i = 0; i < N * nb; ++i)
      for (int at : scales) {
        const uint16_t h = static_cast<uint16_t>(0x1400 + next() % 0x1000);  // fp16 in [2^-10, 2^-6)
        std::memcpy(&raw[i * bytes + at], &h, 2);
      }
    for (int64_t g = 0; g < N / LANES; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blocks[LANES];
        for (int c = 0; c < LANES; ++c) blocks[c] = &raw[((g * LANES + c) * nb + b) * bytes];
        pack_block(t, blocks, &packed[(g * nb + b) * LANES * bytes]);
      }
    std::vector<float> y(M * N);
    const PSeg seg{packed.data(), t, N, 0};
    run(PCall{&seg, 1, a, y.data(), M, K, N}, 0, 0, N / LANES);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t r = 0; r < M; ++r) {
        const float want = reference_one(t, &raw[n * nb * bytes], a, r, K);
        if (std::memcmp(&want, &y[r * N + n], 4) != 0) {
          std::fprintf(stderr, "specserve: the %s build of the int8 kernels gave other bits than the reference on this CPU "
                       "(GGML type %d, row %ld, column %ld: %.9g, not %.9g); it is not used. Please report it, with `specserve env`.\n",
                       name, t, static_cast<long>(r), static_cast<long>(n), y[r * N + n], want);
          return false;
        }
      }
  }
  return true;
}

// Which build q8_linear runs; by default the fastest this CPU has:
//   "amx"      AMX-INT8 tiles for passes of more than AMX_MIN_ROWS rows, VNNI below (unless SPECSERVE_NO_AMX);
//   "vnni"     AVX-512 VNNI;  "avxvnni"  AVX-VNNI (256-bit VPDPBUSD);  "avx2"  AVX2's vpmaddubsw.
// The AMX and AVX-VNNI builds were written without their CPUs: each is the default only once the start-up
// check (agrees) gave the reference's bits on the CPU at hand.
// On request: "reference" (q8_reference), "amx-only" (tiles for every pass), "amx-emulated" (the tile
// build with the tile unit in software, every pass: its tests on AVX-512 CPUs without AMX) and
// "avxvnni-emulated" (the AVX-VNNI build with VPDPBUSD in AVX2: its tests on any CPU). Every build
// gives q8_reference's bits, so the choice moves only the speed.
// The bf16 build's threshold; on a Zen 5 the AMX build's own AVX-512 work breaks even with VNNI near 6
// rows, the tiles' cost left out (docs/decisions.md#amx-int8: unmeasured on an AMX CPU).
constexpr int64_t AMX_MIN_ROWS = 8;

std::string& build() {
  static std::string b = cpu_has_amx_int8() && !std::getenv("SPECSERVE_NO_AMX") && agrees(run_amx, "AMX-INT8") ? "amx"
                         : cpu_has_vnni()                                       ? "vnni"
                         : cpu_has_avxvnni() && agrees(run_avxvnni, "AVX-VNNI")   ? "avxvnni"
                                                                                  : "avx2";
  return b;
}

bool can_run(const std::string& b) {
  if (b == "reference" || b == "avx2" || b == "avxvnni-emulated") return true;
  if (b == "vnni") return cpu_has_vnni();
  if (b == "avxvnni") return cpu_has_avxvnni();
  if (b == "amx" || b == "amx-only") return cpu_has_amx_int8() && cpu_has_vnni();
  if (b == "amx-emulated") return cpu_has_avx512();
  return false;
}

Run runner(const std::string& b, int64_t M) {
  if (b == "avx2") return run_avx2;
  if (b == "avxvnni") return run_avxvnni;
  if (b == "avxvnni-emulated") return run_avxvnni_emulated;
  if (b == "amx-emulated") return run_amx_emulated;
  if (b == "amx-only" || (b == "amx" && M > AMX_MIN_ROWS)) return run_amx;
  return run_vnni;
}

}  // namespace
}  // namespace q8

namespace {

using q8::LANES;

void check_raw(const at::Tensor& raw, int t, int64_t K) {
  const int elems = gguf::block_elems(t);
  TORCH_CHECK(elems > 0 && K % elems == 0, "int8 activations: GGML type ", t, " with K = ", K, " is not one the kernels take");
  TORCH_CHECK(raw.dtype() == at::kByte && raw.dim() == 2 && raw.stride(1) == 1 &&
              raw.size(1) == K / elems * gguf::block_bytes(t), "int8 activations: raw blocks must be u8 [rows, bytes]");
}

}  // namespace

at::Tensor q8_pack(at::Tensor raw, int64_t type, int64_t K) {
  // raw: [N, bytes per row] u8 in GGML type `type` -> [ceil(N / 16), K / block_elems, 16 * block_bytes] u8
  const int t = static_cast<int>(type);
  check_raw(raw, t, K);
  const int64_t N = raw.size(0), groups = (N + LANES - 1) / LANES, nb = K / gguf::block_elems(t);
  const int bytes = gguf::block_bytes(t);
  auto out = at::empty({groups, nb, LANES * bytes}, at::kByte);
  const uint8_t* base = raw.data_ptr<uint8_t>();
  uint8_t* po = out.data_ptr<uint8_t>();
  const int64_t stride = raw.stride(0);
  std::vector<uint8_t> zero(bytes, 0);  // padding columns: zero blocks (scale 0: they add nothing)
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    const uint8_t* blocks[LANES];
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        for (int c = 0; c < LANES; ++c) {
          const int64_t n = g * LANES + c;
          blocks[c] = n < N ? base + n * stride + b * bytes : zero.data();
        }
        q8::pack_block(t, blocks, po + (g * nb + b) * LANES * bytes);
      }
  });
  return out;
}

at::Tensor q8_reference(at::Tensor x, const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types) {
  // x: [M, K] f32; raws[i]: [N_i, bytes] u8 of GGML type types[i] -> y: [M, sum N_i] f32, by the plain formula
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2, "x must be f32 [M, K]");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(raws.size() == types.size() && !raws.empty(), "one type per segment");
  int64_t N = 0;
  for (size_t i = 0; i < raws.size(); ++i) {
    check_raw(raws[i], static_cast<int>(types[i]), K);
    N += raws[i].size(0);
  }
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const q8::Quantised qx = q8::quantise(x, true);
  const q8::Acts a = qx.acts();
  float* py = y.data_ptr<float>();
  int64_t first = 0;
  for (size_t i = 0; i < raws.size(); ++i) {
    const int t = static_cast<int>(types[i]);
    const uint8_t* base = raws[i].data_ptr<uint8_t>();
    const int64_t stride = raws[i].stride(0), rows = raws[i].size(0);
    at::parallel_for(0, rows, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t r = 0; r < M; ++r) py[r * N + first + n] = q8::reference_one(t, base + n * stride, a, r, K);
    });
    first += rows;
  }
  return y;
}

bool q8_build_agrees(const std::string& want) {
  TORCH_CHECK(q8::can_run(want) && want != "reference", "q8_build_agrees: this CPU cannot run the ", want, " build");
  return q8::agrees(q8::runner(want, 20), want.c_str());
}

std::string q8_kernel_build(c10::optional<std::string> want) {
  // a build this CPU cannot run leaves the current one (the caller sees it in the answer)
  if (want) {
    static const std::vector<std::string> builds = {"amx", "vnni", "avxvnni", "avx2", "reference", "amx-only", "amx-emulated",
                                                    "avxvnni-emulated"};
    if (std::find(builds.begin(), builds.end(), *want) == builds.end()) {
      std::string names;
      for (const auto& b : builds) names += (names.empty() ? "" : ", ") + b;
      TORCH_CHECK(false, "q8 builds: ", names);
    }
    if (q8::can_run(*want)) q8::build() = *want;
  }
  return q8::build();
}

at::Tensor q8_linear(at::Tensor x, const std::vector<at::Tensor>& w) {
  // w: [packed_0 .. packed_k-1, raw_0 .. raw_k-1, meta] with meta int32 [k, 2] (GGML type, rows) per
  // segment (Int8Weight.parts) -> y [M, sum rows] f32
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2, "x must be f32 [M, K]");
  const at::Tensor meta = w.back().contiguous();
  const int64_t k = meta.size(0);
  TORCH_CHECK(meta.scalar_type() == at::kInt && meta.dim() == 2 && static_cast<int64_t>(w.size()) == 2 * k + 1,
              "int8 activations: parts are [packed..., raw..., meta]");
  const int32_t* m = meta.data_ptr<int32_t>();
  const std::string& build = q8::build();
  if (build == "reference") {
    std::vector<int64_t> types(k);
    for (int64_t i = 0; i < k; ++i) types[i] = m[2 * i];
    return q8_reference(x, std::vector<at::Tensor>(w.begin() + k, w.end() - 1), types);
  }
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<q8::PSeg> segs;
  std::vector<int64_t> group_end;  // cumulative groups: the flat index threads split
  int64_t first = 0, groups = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int t = m[2 * i];
    const int64_t rows = m[2 * i + 1], g = (rows + LANES - 1) / LANES;
    const at::Tensor& p = w[i];
    TORCH_CHECK(p.dtype() == at::kByte && p.is_contiguous() && p.size(0) == g &&
                p.size(1) * gguf::block_elems(t) == K, "int8 activations: a packed segment does not fit x");
    segs.push_back({p.data_ptr<uint8_t>(), t, rows, first});
    first += rows;
    groups += g;
    group_end.push_back(groups);
  }
  auto y = at::empty({M, first}, x.options());
  if (M == 0) return y;
  const q8::Quantised qx = q8::quantise(x, false);
  const q8::PCall call{segs.data(), static_cast<int>(segs.size()), qx.acts(), y.data_ptr<float>(), M, K, first};
  const q8::Run run = q8::runner(build, M);
  const int64_t grain = std::max<int64_t>(1, groups / (8 * at::get_num_threads()));
  at::parallel_for(0, groups, grain, [&](int64_t a, int64_t b) {
    int64_t start = 0;
    for (int i = 0; i < static_cast<int>(segs.size()); ++i) {
      const int64_t lo = std::max(a, start), hi = std::min(b, group_end[i]);
      if (lo < hi) run(call, i, lo - start, hi - start);
      start = group_end[i];
    }
  });
  return y;
}

}  // namespace specserve
