"""Arrival processes and trace replay, seeded. Times in seconds from 0, sorted.

Gamma(rate, CV) inter-arrivals have shape 1/CV^2 and scale CV^2/rate: mean 1/rate, and CV 1 is
Poisson. Traces: a per-request CSV (timestamp, model[, input_tokens, output_tokens]), the Azure LLM
inference trace's columns (TIMESTAMP, ContextTokens, GeneratedTokens), or per-minute invocation
counts per function (Azure Functions 2019: HashFunction, then minute columns 1..1440).
"""
from __future__ import annotations

import csv
import math
from datetime import datetime
from typing import Optional, Sequence

import numpy as np

from .simulator import Arrival

# What one simulated workload may ask for: beyond this the arrays alone outgrow the machine.
MAX_RATE = 1e5  # requests per second
MAX_ARRIVALS = 2e7


def gamma_arrivals(rate: float, cv: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    if rate <= 0 or cv <= 0 or duration <= 0:
        raise ValueError(f"gamma workload needs rate, cv and duration > 0 (got rate={rate}, cv={cv}, duration={duration})")
    shape, scale = 1.0 / cv**2, cv**2 / rate
    n = int(rate * duration * 1.5) + 64
    times = np.cumsum(rng.gamma(shape, scale, size=n))
    while times[-1] < duration:  # rare with bursty CV: draw more
        times = np.concatenate([times, times[-1] + np.cumsum(rng.gamma(shape, scale, size=n))])
    return times[times < duration]


def poisson_arrivals(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    return gamma_arrivals(rate, 1.0, duration, rng)


def power_law_weights(n: int, skew: float) -> np.ndarray:
    """Share of the total rate per model: proportional to rank^-skew (0: even). AlpaServe's
    synthetic workloads give models power-law rates, a few popular models and a long tail."""
    if not (math.isfinite(skew) and skew >= 0):
        raise ValueError(f"skew must be a finite number >= 0, got {skew!r}")
    w = np.arange(1, n + 1, dtype=float) ** -skew
    return w / w.sum()


def multi_model(models: Sequence[str], rate: float, cv: float, duration: float, seed: int,
                weights: Optional[Sequence[float]] = None, skew: float = 0.0) -> list[Arrival]:
    """Total `rate` split over models (evenly, by power-law `skew` in model order, or by `weights`),
    each its own Gamma(rate_i, cv) process."""
    rng = np.random.default_rng(seed)
    w = power_law_weights(len(models), skew) if weights is None else np.asarray(weights, dtype=float)
    w = w / w.sum()
    reqs = [Arrival(float(t), m) for m, wi in zip(models, w) for t in gamma_arrivals(rate * wi, cv, duration, rng)]
    reqs.sort(key=lambda r: r.arrival)
    return reqs


def load_trace(path: str, models: Sequence[str], seed: int = 0, time_scale: float = 1.0) -> list[Arrival]:
    """Replay a CSV trace; functions or unnamed requests are mapped onto `models` round-robin."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise ValueError(f"{path}: cannot read trace ({e.strerror})") from None
    if len(rows) < 2:
        raise ValueError(f"{path}: trace has no rows")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if any(c.strip() for c in r)]
    lower = [h.lower() for h in header]
    try:
        if "timestamp" in lower and "contexttokens" in lower:  # Azure LLM inference trace
            ti = lower.index("timestamp")
            stamps = [_parse_time(r[ti]) for r in body]
            t0 = min(stamps)
            reqs = [Arrival((s - t0) * time_scale, models[i % len(models)]) for i, s in enumerate(sorted(stamps))]
        elif "timestamp" in lower and "model" in lower:  # per-request layout
            ti, mi = lower.index("timestamp"), lower.index("model")
            reqs = [Arrival(float(r[ti]) * time_scale, r[mi].strip()) for r in body]
            unknown = {r.model for r in reqs} - set(models)
            if unknown:
                raise ValueError(f"models {sorted(unknown)} are not among the placed models")
        elif "hashfunction" in lower:  # Azure Functions 2019: per-minute counts
            first = next(i for i, h in enumerate(header) if h.isdigit())
            rng = np.random.default_rng(seed)
            reqs = []
            for fi, r in enumerate(body):
                counts = np.asarray([int(float(c or 0)) for c in r[first:]])
                minute = np.repeat(np.arange(len(counts)), counts)
                times = (minute + rng.random(len(minute))) * 60.0 * time_scale
                reqs += [Arrival(float(t), models[fi % len(models)]) for t in times]
        else:
            raise ValueError("unknown layout: expected columns (timestamp, model), (TIMESTAMP, ContextTokens, "
                             "GeneratedTokens) or (HashFunction, 1..1440)")
    except (ValueError, IndexError) as e:
        raise ValueError(f"{path}: malformed trace: {e}") from None
    reqs.sort(key=lambda r: r.arrival)
    return reqs


def _parse_time(s: str) -> float:
    s = s.strip()
    try:
        return float(s)
    except ValueError:
        # Azure's "2023-11-16 18:15:46.6805900": trim to microseconds for fromisoformat
        head, _, frac = s.partition(".")
        return datetime.fromisoformat(head + ("." + frac[:6] if frac else "")).timestamp()


def parse_workload(spec: str, models: list[str], duration: float, seed: int) -> list[Arrival]:
    """A workload named on the command line: gamma:rate=R,cv=C[,skew=A], poisson:rate=R[,skew=A] or
    trace:PATH. skew: per-model rates proportional to rank^-A (0, the default: even)."""
    kind, _, rest = spec.partition(":")
    if kind == "trace":
        return load_trace(rest, models, seed=seed)
    try:
        kv = {k.strip(): float(v) for k, v in (item.split("=") for item in rest.split(",") if item.strip())}
    except ValueError:
        raise ValueError(f"workload {spec!r}: expected KIND:key=value,... e.g. gamma:rate=20,cv=4") from None
    unknown = set(kv) - {"rate", "cv", "skew"}
    if unknown:
        raise ValueError(f"workload {spec!r}: unknown keys {sorted(unknown)} (known: rate, cv, skew)")
    if not all(math.isfinite(v) and (v > 0 or (k == "skew" and v == 0)) for k, v in kv.items()):
        raise ValueError(f"workload {spec!r}: rate and cv must be finite numbers > 0, skew >= 0")
    if "rate" in kv and (kv["rate"] > MAX_RATE or kv["rate"] * duration > MAX_ARRIVALS):
        raise ValueError(f"workload {spec!r}: at most {MAX_RATE:g} requests/s and {MAX_ARRIVALS:g} arrivals in all "
                         f"(rate x duration = {kv['rate'] * duration:g})")
    if kind == "gamma" and "rate" in kv:
        return multi_model(models, kv["rate"], kv.get("cv", 1.0), duration, seed, skew=kv.get("skew", 0.0))
    if kind == "poisson" and "rate" in kv and "cv" not in kv:
        return multi_model(models, kv["rate"], 1.0, duration, seed, skew=kv.get("skew", 0.0))
    raise ValueError(f"workload {spec!r}: expected gamma:rate=R,cv=C[,skew=A], poisson:rate=R[,skew=A] or trace:PATH")
