"""A serving placement: which models are served, under which names, and how many replicas of each
run where. Read from JSON (written by hand or by `specserve plan --llm --placement-out`):

    {"models": {"coder": {"model": "qwen2.5-coder-1.5b", "speculative": "auto"},
                "small": {"model": "smollm2-135m"}},
     "replicas": [{"model": "coder"}, {"model": "coder"}, {"model": "small", "num_cpus": 1}]}

Each model's object holds the keyword arguments of LLM(...) for its replicas ("model" is required:
null is the embedded model);
each replica names its model, and may ask Ray for CPUs / GPUs (default 0: replicas share the node's
cores, each with the threads its engine is given), name a node ("node": an IP, Ray's `node:<ip>`
resource) for a multi-node cluster, keep to some cores of its machine ("cores": [0] pins its engine's
threads there, as a planner's device stands for cores), change some of its model's arguments ("overrides": a replica
that carries a draft, {"speculative": "draft"}) and say which of the planner's devices it stands for
("device": replicas naming the same device on the same node share it, and the router counts their
requests together).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional


class PlacementError(ValueError):
    """A placement file that cannot be served (one line: the file and what is wrong)."""


@dataclass(frozen=True)
class ReplicaSpec:
    model: str  # a served model's name (a key of ServePlacement.models)
    num_cpus: float = 0.0
    num_gpus: float = 0.0
    node: Optional[str] = None  # a node's IP: the replica runs there (Ray's node:<ip> resource)
    overrides: dict = field(default_factory=dict)  # LLM(...) arguments of this replica only
    device: Optional[int] = None  # the planner's device it stands for (replicas on one device share it)
    cores: Optional[tuple[int, ...]] = None  # the CPU cores its engine computes on (None: any)


@dataclass
class ServePlacement:
    models: dict[str, dict]  # served name -> LLM(...) keyword arguments
    replicas: list[ReplicaSpec] = field(default_factory=list)

    def engine_kwargs(self, i: int) -> dict:
        """LLM(...)'s keyword arguments for replica i: its model's, with its own overrides."""
        return {**self.models[self.replicas[i].model], **self.replicas[i].overrides}

    @classmethod
    def from_devices(cls, devices: list[tuple[list[str], list[str]]], models: dict[str, dict],
                     draft_overrides: dict) -> "ServePlacement":
        """A planner's placement ([(models, models carrying their draft)] per device) as replicas: one
        per model a device holds, with draft_overrides where it carries its draft."""
        replicas = [ReplicaSpec(m, overrides=dict(draft_overrides) if m in drafts else {}, device=d)
                    for d, (names, drafts) in enumerate(devices) for m in names]
        return cls.from_dict(cls(dict(models), replicas).to_dict())

    @classmethod
    def load(cls, path: str) -> "ServePlacement":
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except OSError as e:
            raise PlacementError(f"{path}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise PlacementError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        try:
            return cls.from_dict(raw)
        except PlacementError as e:
            raise PlacementError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, raw) -> "ServePlacement":
        if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict) or not raw["models"]:
            raise PlacementError('a placement needs "models": {name: {"model": ..., ...}}')
        models = {}
        for name, kw in raw["models"].items():
            if not isinstance(kw, dict) or "model" not in kw or not (kw["model"] is None or isinstance(kw["model"], str)):
                raise PlacementError(f'model "{name}" needs "model": a known model\'s name, a path, or null (the embedded model)')
            models[name] = dict(kw)
        reps = raw.get("replicas")
        if not isinstance(reps, list) or not reps:
            raise PlacementError('a placement needs "replicas": [{"model": name}, ...]')
        replicas = []
        for i, r in enumerate(reps):
            if not isinstance(r, dict) or r.get("model") not in models:
                raise PlacementError(f"replica {i} names no model of this placement (known: {', '.join(models)})")
            extra = set(r) - {"model", "num_cpus", "num_gpus", "node", "overrides", "device", "cores"}
            if extra:
                raise PlacementError(f"replica {i}: unknown keys {sorted(extra)}")
            for k in ("num_cpus", "num_gpus"):
                v = r.get(k, 0)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                    raise PlacementError(f"replica {i}: {k} must be a number >= 0, got {v!r}")
            if not isinstance(r.get("overrides", {}), dict) or "model" in r.get("overrides", {}):
                raise PlacementError(f'replica {i}: "overrides" must be an object of LLM arguments other than "model"')
            cores = r.get("cores")
            if cores is not None and (not isinstance(cores, list) or not cores
                                      or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cores)):
                raise PlacementError(f'replica {i}: "cores" must be a non-empty list of core numbers, got {cores!r}')
            replicas.append(ReplicaSpec(r["model"], float(r.get("num_cpus", 0)), float(r.get("num_gpus", 0)), r.get("node"),
                                        dict(r.get("overrides", {})), r.get("device"),
                                        tuple(cores) if cores is not None else None))
        unserved = [m for m in models if not any(r.model == m for r in replicas)]
        if unserved:
            raise PlacementError(f"models without a replica: {', '.join(unserved)}")
        return cls(models, replicas)

    def to_dict(self) -> dict:
        reps = []
        for r in self.replicas:
            d = {"model": r.model}
            if r.num_cpus:
                d["num_cpus"] = r.num_cpus
            if r.num_gpus:
                d["num_gpus"] = r.num_gpus
            if r.node:
                d["node"] = r.node
            if r.overrides:
                d["overrides"] = r.overrides
            if r.device is not None:
                d["device"] = r.device
            if r.cores is not None:
                d["cores"] = list(r.cores)
            reps.append(d)
        return {"models": self.models, "replicas": reps}
