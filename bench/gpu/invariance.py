"""Is a projection's row the same bits whatever the rows beside it? cuBLAS picks its kernel by the row
count M, and a verify pass over M rows (1 + K a sequence for a chain, 1 + W K for a token tree) may
round differently from regular decoding's pass over one row: then greedy identity between them holds
only by luck in bfloat16 (bench/results/gpu/README.md, runs 7-8). For SmolLM2-135M's projection shapes
and each dtype: the row counts M at which every row of x[:M] @ W.T equals that row computed alone, by
torch (cuBLAS) and by cuda/linear.py's fixed tiling (`batch_invariant`), which should hold at every M.

    python bench/gpu/invariance.py > invariance.json     (on a GPU; --device cpu to check the script)
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from specserve.cuda import linear

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}
ROWS = (1, 2, 3, 4, 8, 13, 16, 17, 19, 24, 32, 48, 64, 104, 128, 136, 152)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "torch": torch.__version__}
    cpu = args.device == "cpu"  # a check of the script itself: Triton's interpreter is slow
    rows = [m for m in ROWS if m <= 17] if cpu else ROWS
    for dt in (torch.bfloat16, torch.float32):
        for name, (k, n) in SHAPES.items():
            if cpu and name == "lm_head":
                continue
            w = (torch.randn(n, k, device=args.device) * k ** -0.5).to(dt)
            x = torch.randn(max(rows), k, device=args.device).to(dt)
            for lib, fn in (("torch", F.linear), ("invariant", linear.linear if linear.available() else None)):
                if fn is None:
                    continue
                alone = torch.cat([fn(x[i:i + 1], w) for i in range(max(rows))])  # [rows, n], one row a call
                same = [m for m in rows if torch.equal(fn(x[:m], w), alone[:m])]
                out[f"{lib}_{str(dt).removeprefix('torch.')}_{name}"] = {"same": same, "differs": [m for m in rows if m not in same]}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
