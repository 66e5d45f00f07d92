// One whole decoder layer in one call, for decode-sized batches on the fp32 CPU path.
//
// At one token a step, a layer's real work is ~0.3 ms, while issuing its ~20 small ops from Python
// costs ~5 us each: a tenth of the step. Chaining the same kernels here removes that overhead and
// computes exactly what the op-by-op path computes (same kernels, same order).
#include <torch/extension.h>  // the binding file: pybind11 and the torch types it converts

#include "ops.h"

namespace specserve {
namespace {

// A blocked weight as {qs, scales, mins} (+ the AMX copy); mins is empty for Q8_0.
torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& w) { return block_linear(x, w); }

// Gemma 3's QK-norm: each head of qkv's first `heads` heads, RMS-normalised over its D values, in place.
void head_norm_(torch::Tensor& qkv, int64_t first, int64_t heads, int64_t D, const torch::Tensor& w, double eps) {
  const int64_t T = qkv.size(0);
  auto part = qkv.narrow(1, first * D, heads * D);  // [T, heads D], rows strided when T > 1
  part.copy_(rms_norm(part.reshape({T * heads, D}).contiguous(), c10::nullopt, w, eps).view({T, heads * D}));
}

// x: the residual stream [T, hidden], updated in place (x += delta, then x += attention output).
// Returns this layer's MLP output, which the next layer (or the final norm) adds to x.
// Gemma 3 (models/gemma3.py) passes its four extra norms, gelu = true (GeGLU) and its layer's window;
// the Llama family passes none, gelu = false, window 0. Each step is the op models/decoder.py's
// reference calls, in its order, so both paths give the same bits.
torch::Tensor decoder_layer(torch::Tensor x, c10::optional<torch::Tensor> delta, torch::Tensor attn_norm,
                            torch::Tensor ffn_norm, double eps, std::vector<torch::Tensor> qkv_w,
                            c10::optional<torch::Tensor> qkv_bias, std::vector<torch::Tensor> o_w,
                            std::vector<torch::Tensor> gate_up_w, std::vector<torch::Tensor> down_w,
                            torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor slot_mapping, torch::Tensor tables, torch::Tensor q_starts,
                            torch::Tensor q_lens, torch::Tensor kv_lens, int64_t block_size, double scale,
                            int64_t H, int64_t Hkv, int64_t D, c10::optional<torch::Tensor> span_lens,
                            c10::optional<torch::Tensor> tree_mask, c10::optional<torch::Tensor> q_norm,
                            c10::optional<torch::Tensor> k_norm, c10::optional<torch::Tensor> post_attn_norm,
                            c10::optional<torch::Tensor> post_ffn_norm, bool gelu, int64_t window) {
  const int64_t T = x.size(0);
  TORCH_CHECK(slot_mapping.dtype() == torch::kInt64 && slot_mapping.numel() == T, "one KV slot per token");
  TORCH_CHECK(H > 0 && Hkv > 0 && D > 0, "decoder_layer: bad head counts");
  torch::Tensor h = rms_norm(x, delta, attn_norm, eps);
  torch::Tensor qkv = linear(h, qkv_w);  // [T, (H + 2 Hkv) D]
  if (qkv_bias) qkv.add_(*qkv_bias);
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "decoder_layer: q_norm and k_norm come together");
  if (q_norm) {
    head_norm_(qkv, 0, H, D, *q_norm, eps);
    head_norm_(qkv, H, Hkv, D, *k_norm, eps);
  }
  rope_(qkv, cos, sin, H + Hkv, D);
  // an f16 cache (--kv-cache-dtype float16): rounded once, here
  k_cache.index_copy_(0, slot_mapping, qkv.narrow(1, H * D, Hkv * D).view({T, Hkv, D}).to(k_cache.scalar_type()));
  v_cache.index_copy_(0, slot_mapping, qkv.narrow(1, (H + Hkv) * D, Hkv * D).view({T, Hkv, D}).to(v_cache.scalar_type()));
  torch::Tensor q = qkv.narrow(1, 0, H * D).contiguous().view({T, H, D});
  torch::Tensor attn = paged_attention(q, k_cache, v_cache, tables, q_starts, q_lens, kv_lens, block_size, scale,
                                       span_lens, tree_mask, window);
  torch::Tensor out = linear(attn.view({T, H * D}), o_w);
  if (post_attn_norm) out = rms_norm(out, c10::nullopt, *post_attn_norm, eps);
  h = rms_norm(x, out, ffn_norm, eps);
  torch::Tensor gu = linear(h, gate_up_w);  // [T, 2 F]: gate | up
  if (gelu) {  // GeGLU, as layers.gelu_tanh_mul computes it
    const int64_t F = gu.size(1) / 2;
    out = linear(at::gelu(gu.narrow(1, 0, F), "tanh") * gu.narrow(1, F, F), down_w);
  } else {
    out = linear(silu_mul(gu), down_w);
  }
  if (post_ffn_norm) out = rms_norm(out, c10::nullopt, *post_ffn_norm, eps);
  return out;
}

}  // namespace
}  // namespace specserve

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace specserve;
  m.def("block_matmul", &block_matmul, "y = x @ dequant(W)^T for GGML-blocked W (fp32 in/out)");
  m.def("block_kernel_avx512", &block_kernel_avx512, "whether block_matmul uses its AVX-512 build; pass a bool to switch",
        py::arg("enable") = py::none());
  m.def("block_pack_amx", &block_pack_amx, "regroup GGML blocks for the AMX build: [packed, scales, mins]");
  m.def("block_matmul_amx", &block_matmul_amx, "block_matmul over weights from block_pack_amx");
  m.def("block_kernel_amx", &block_kernel_amx, "whether this CPU (and OS) gives AMX tiles");
  m.def("gguf_linear", &gguf_linear, "y = x @ dequant(W)^T for W in GGUF's own blocks, segments of several types");
  m.def("gguf_dequantize_rows", &gguf_dequantize_rows, "rows of a GGUF-blocked table as f32 (an embedding lookup)");
  m.def("gguf_kernel_panels", &gguf_kernel_panels, "whether gguf_linear's AVX2 build runs passes of 16+ rows in panels; pass a bool to switch",
        py::arg("enable") = py::none());
  m.def("q8_pack", &q8_pack, "regroup a GGUF tensor's blocks for the int8-activation build (16 columns a group)");
  m.def("q8_linear", &q8_linear, "y = x @ W^T with x quantised to 8 bits per 32 values (Int8Weight parts)");
  m.def("q8_reference", &q8_reference, "q8_linear's formula, plainly, over the file's own blocks");
  m.def("q8_build_agrees", &q8_build_agrees, "whether a q8 build gives the reference's bits here (the AMX build's start-up check)");
  m.def("q8_kernel_build", &q8_kernel_build, "q8_linear's build (q8_matmul.cpp lists them); pass a name to switch",
        py::arg("want") = py::none());
  m.def("block_linear", &block_linear, "a blocked weight's product on the build that suits the pass");
  m.def("rms_norm", &rms_norm, "(x += residual); w * x / rms(x)");
  m.def("rope_", &rope_, "rotate-half RoPE in place on the first heads of qkv rows");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("paged_attention", &paged_attention, "causal (or token-tree) attention of short query spans over the paged KV cache",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("q_starts"),
        py::arg("q_lens"), py::arg("kv_lens"), py::arg("block_size"), py::arg("scale"),
        py::arg("span_lens") = py::none(), py::arg("tree_mask") = py::none(), py::arg("window") = 0);
  m.def("draw_rows", &draw_rows, "one token per row of probs [N, V] at uniforms u [N]: the first whose cumulative mass exceeds u * total");
  m.def("decoder_layer", &decoder_layer, "a whole decoder layer for decode-sized batches");
}
