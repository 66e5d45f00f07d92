"""Issue 41's GPU table from the JSON that bench/gpu/run.py wrote: every number here is read from
those files, none typed in. Usage: python bench/gpu/table.py SHAPE.json SMOLLM.json [SPEC.json] > table.md
       python bench/gpu/table.py --rounds SPEC.json [SPEC.json ...] > rounds.md  (cuda/rounds.py's variants)
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def table(shape: dict, smollm: dict, spec: Optional[dict] = None) -> str:
    sh, sm = shape["results"].get("shape", {}), smollm["results"].get("smollm", {})
    kc = shape["results"].get("kernel_check", {})
    lines = [f"# GPU table (issue 41): {smollm.get('gpu')}", "",
             f"torch {smollm.get('torch')}, triton {smollm.get('triton')}, transformers {smollm.get('transformers')}; "
             f"runs of {os.path.basename(shape['_file'])} ({shape['time']}) and {os.path.basename(smollm['_file'])} "
             f"({smollm['time']}). Greedy, 128 new tokens per sequence, EOS ignored. ms/token: the mean per-token "
             "latency of the sequences (prefill steps included, as a user sees it); step ms: the median engine "
             "step of the steps that replayed a graph (sampling included); the ratio to HF static+compile "
             "divides by step ms (by ms/token where a run has no step times).", "",
             "## Regular decoding", "",
             "| model | dtype | batch | specserve graphs ms/token | step ms | eager engine ms/token | HF eager ms/step | "
             "HF static+compile ms/step | vs HF static+compile |", "|---|---|---|---|---|---|---|---|---|"]
    for b in (1, 8, 16):
        ours = sm.get(f"bf16_graph_b{b}_ms")
        step = sm.get(f"bf16_graph_b{b}_step_ms")
        comp = sm.get(f"hf_bf16_static_compile_b{b}_ms")
        lines.append(f"| SmolLM2-135M (GGUF Q4_1, dequantised) | bf16 | {b} | {_f(ours)} | {_f(step)} | "
                     f"{_f(sm.get(f'bf16_eager_b{b}_ms'))} | {_f(sm.get(f'hf_bf16_eager_b{b}_ms'))} | {_f(comp)} | "
                     f"{_ratio(comp, step if step is not None else ours)} |")
    for b in (1, 8):
        lines.append(f"| SmolLM2-135M | fp32 | {b} | {_f(sm.get(f'fp32_graph_b{b}_ms'))} | "
                     f"{_f(sm.get(f'fp32_graph_b{b}_step_ms'))} | - | {_f(sm.get('hf_fp32_eager_b1_ms')) if b == 1 else '-'} | - | - |")
    for b in (1, 8, 16):
        ours = sh.get(f"engine_graph_b{b}_ms")
        comp = sh.get(f"hf_static_compile_b{b}_ms")
        lines.append(f"| Qwen2.5-Coder-1.5B shape (random) | bf16 | {b} | - | {_f(ours)} | "
                     f"{_f(sh.get(f'engine_eager_b{b}_ms'))} | {_f(sh.get(f'hf_eager_b{b}_ms'))} | {_f(comp)} | "
                     f"{_ratio(comp, ours)} |")
    dr = shape["results"].get("draft", {})
    for b in (1, 8, 16):
        eager, graph = dr.get(f"eager_b{b}_ms"), dr.get(f"graph_b{b}_ms")
        if graph is not None:
            lines.append("| draft model, ms a one-row pass: Qwen2.5-Coder-0.5B shape (random, head 65,536) | bf16 | "
                         f"{b} | - | {_f(graph)} | {_f(eager)} | - | - | - |")
    lines += ["", "The 1.5B shape runs the engine's steps without its scheduler (no tokenizer for random weights): "
              "prefill, then runner.execute + argmax per step; its 'step ms' is that loop's.", "",
              "## Greedy identity", "",
              f"- fp32 graphs vs HF transformers fp32 (batch 1): {sm.get('fp32_graph_identical_to_hf_fp32_b1')} prompts identical",
              f"- speculation (EAGLE, BASS, no fallback) vs regular, bf16: batch 1 {sm.get('bf16_spec_identical_b1')}, "
              f"batch 8 {sm.get('bf16_spec_identical_b8')}; fp32: batch 1 {sm.get('fp32_spec_identical_b1')}, "
              f"batch 8 {sm.get('fp32_spec_identical_b8')}",
              f"- kernel check (1.5B shape, bf16, one padded step of a decode, a chain and a tree, graphed vs the "
              f"eager reference): max |logit diff| {_f(kc.get('torch.bfloat16_max_logit_diff'), '{:.3f}')} at logits up to "
              f"{_f(kc.get('torch.bfloat16_logit_scale'), '{:.2f}')}, argmax {kc.get('torch.bfloat16_argmax_same')}",
              f"- random 1.5B shape, greedy tokens graphed vs eager steps (bf16): batch 1 "
              f"{sh.get('graph_vs_eager_b1_agree')}, batch 16 {sh.get('graph_vs_eager_b16_agree')} (leading tokens "
              f"shared; random weights give near-flat logits, where bf16 rounding flips the argmax)",
              f"- random 0.5B-shape draft, greedy picks of graphed vs eager one-row passes: batch 1 "
              f"{dr.get('graph_vs_eager_b1_agree')}, batch 16 {dr.get('graph_vs_eager_b16_agree')}", "",
              "## Speculation (EAGLE draft) vs regular decoding, same run", "",
              "| variant | dtype | batch | ms/token | step ms | speed-up (ms/token) | identical | alpha | c |",
              "|---|---|---|---|---|---|---|---|---|"]
    rows = [(smollm, "bf16", "bf16_spec", "BASS, no fallback"), (smollm, "fp32", "fp32_spec", "BASS, no fallback"),
            (smollm, "bf16", "bf16_spec_fallback", "cost model (smollm stage)")]
    if spec is not None:
        rows += [(spec, "bf16", "bf16_spec_auto", f"cost model ({os.path.basename(spec['_file'])})")]
        rows += [(spec, "bf16", f"bf16_spec_k{k}", f"fixed k={k} ({os.path.basename(spec['_file'])})") for k in (2, 3, 4)]
    for src, dt, tag, name in rows:
        r = src["results"].get("smollm", {})
        st = r.get(f"{tag}_stats") or {}
        for b in (1, 8):
            base = r.get(f"{dt}_graph_b{b}_ms")
            ms = r.get(f"{tag}_b{b}_ms")
            if ms is None:  # a variant this run did not have
                continue
            ident = r.get(f"{tag}_identical_b{b}")
            lines.append(f"| {name} | {dt} | {b} | {_f(ms)} | {_f(r.get(f'{tag}_b{b}_step_ms'))} | {_ratio(base, ms)} | "
                         f"{ident or '-'} | {_f(st.get('alpha'))} | {_f(st.get('c'))} |")
    return "\n".join(lines) + "\n"


def rounds_table(docs: list[dict]) -> str:
    """Rounds on the device (`--only spec --rounds M`) against the one-step-per-sync engine of the same run:
    per variant and batch, ms/token, the ratio to regular decoding one step a sync and to regular decoding
    in rounds of the same M, greedy identity, and from the rounds' CUDA events the GPU's ms per round
    and the tokens a sequence gets per round."""
    lines = ["| run | variant | dtype | batch | ms/token | vs regular, 1 step/sync | vs regular, same rounds | "
             "identical | tokens/round | GPU ms/round |", "|---|---|---|---|---|---|---|---|---|---|"]
    for d in docs:
        r = d["results"].get("smollm", {})
        run = os.path.basename(d["_file"]).removeprefix("gpu-smollm-spec-").removesuffix(".json")
        for dt in ("bf16", "fp32"):
            tags = sorted({k[len(dt) + 6:].rsplit("_b", 1)[0] for k in r if k.startswith(f"{dt}_spec_rounds") and k.endswith("_ms")
                           and "_step_" not in k})
            for tag in tags:
                m = tag.split("_")[0]  # rounds16
                kind = ("regular" if tag.endswith("regular") else f"EAGLE tree {tag.split('_tree')[-1]} (K x beam x top-k)"
                        if "_tree" in tag else f"EAGLE k={tag.split('_k')[-1]}")
                name = f"{m[6:] or '8'} rounds/sync, {kind}"
                by = r.get(f"{dt}_spec_{tag}_rounds_by_batch") or {}
                for b in (1, 8):
                    ms = r.get(f"{dt}_spec_{tag}_b{b}_ms")
                    if ms is None:
                        continue
                    st = by.get(str(b)) or by.get(b) or {}
                    lines.append(f"| {run} | {name} | {dt} | {b} | {_f(ms, '{:.3f}')} | {_ratio(r.get(f'{dt}_graph_b{b}_ms'), ms)} | "
                                 f"{_ratio(r.get(f'{dt}_spec_{m}_regular_b{b}_ms'), ms)} | "
                                 f"{r.get(f'{dt}_spec_{tag}_identical_b{b}') or '-'} | {_f(st.get('tokens_per_seq_round'))} | "
                                 f"{_f(st.get('gpu_ms_per_round'), '{:.3f}')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    paths = (argv or sys.argv[1:])
    rounds = paths[:1] == ["--rounds"]
    paths = paths[1:] if rounds else paths
    docs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        d["_file"] = p
        docs.append(d)
    print(rounds_table(docs) if rounds else table(*docs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
