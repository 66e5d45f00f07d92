"""Where a bench's results go: JSON (everything), markdown (the tables), PNG (the figure, where
matplotlib is installed) and any HTML pages, all under one time-stamped name."""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional


def write_results(result: dict, out_dir: str, prefix: str, markdown: Callable[[dict], str],
                  plot: Callable[[dict, str], None], pages: Optional[dict[str, str]] = None) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, prefix + "-" + time.strftime("%Y%m%d-%H%M%S"))
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    try:
        plot(result, base + ".png")
    except ImportError:
        pass
    for name, page in (pages or {}).items():
        with open(f"{base}-{name}.html", "w") as f:
            f.write(page)
    print(markdown(result))
    print(f"written {base}.json / .md / .png" + "".join(f" / -{name}.html" for name in pages or {}))
    return result
