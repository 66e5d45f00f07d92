"""The server's side of a placement on Ray: one AsyncLLM-like object per served model (ModelReplicas),
and the set of them (ReplicaSet) that launches the actors, watches them and sums their statistics.

Routing (Ray Serve's power-of-two idea without the sampling, as there are few replicas): a request
goes to the live replica of its model whose device has the fewest requests this router has in flight
(replicas that name the same "device" share its cores: a planner's device holding two models), then
the fewest on the replica itself, then the least KV in use (the last statistics polled), then index.
Everything a request needs is on the replica that takes it, so no state moves between replicas.

A replica that dies (its process killed, its node gone) fails only the requests it held: each of
their streams raises ReplicaDiedError (an EngineDeadError: the server answers 503, as an error
event in a stream), and the replica leaves the routing. The other replicas go on untouched.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field, fields
from typing import AsyncIterator, Optional

from ..engine.async_llm import EngineStats
from ..engine.llm import Prompt, chat_token_ids, prompt_token_ids
from ..types import EngineDeadError, SamplingParams, StreamDelta
from .placement import PlacementError, ReplicaSpec, ServePlacement
from .replica import Replica

STATS_EVERY_S = 0.5  # how often the watcher polls each replica's statistics (routing and /metrics)


class ReplicaDiedError(EngineDeadError):
    pass


def local_ray(num_cpus: Optional[int] = None) -> None:
    """A one-machine Ray cluster whose servers all listen on loopback only. On Linux Ray takes a
    reachable address as the node's and binds every server to all interfaces; its single-machine
    mode (the one it uses on macOS) makes the node's address loopback, and it is asked for here."""
    import ray
    import ray._private.ray_constants as ray_constants
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the raylet and workers read it too
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at ray's import, which may have happened already
    ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=100 * 2**20, configure_logging=False,
             log_to_driver=False)


@dataclass
class ReplicaState:
    """One actor as the router sees it (the watcher thread updates stats and alive)."""

    index: int  # in the placement's replica list
    model: str
    actor: object  # a Ray actor handle running Replica
    pid: int = 0
    cores: list = field(default_factory=list)  # the cores its process may run on
    in_flight: int = 0  # requests this router has on it now
    alive: bool = True
    stats: EngineStats = field(default_factory=EngineStats)
    peers: list = field(default_factory=list)  # the replicas on its device, itself included

    @property
    def device_in_flight(self) -> int:
        return sum(p.in_flight for p in self.peers) if self.peers else self.in_flight

    @property
    def kv_share(self) -> float:
        return self.stats.kv_blocks_used / self.stats.kv_blocks_total if self.stats.kv_blocks_total else 0.0


class ModelReplicas:
    """A served model over its replicas, with the surface of AsyncLLM that the server uses: encode,
    encode_chat, check, generate, abort, tokenizer, model_name, max_model_len, cache_tokens (statistics: ReplicaSet)."""

    def __init__(self, name: str, replicas: list[ReplicaState], info: dict):
        self.model_name = name
        self.replicas = replicas
        self.tokenizer = info["tokenizer"]
        self.max_model_len = info["max_model_len"]
        self.cache_tokens = info["cache_tokens"]
        self._keys = itertools.count()
        self._running: dict[str, ReplicaState] = {}  # request id -> the replica holding it

    def encode(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        return prompt_token_ids(self.tokenizer, prompt, add_special_tokens)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: Optional[list[dict]] = None, continue_final_message: bool = False,
                    chat_template_kwargs: Optional[dict] = None) -> list[int]:
        return chat_token_ids(self.tokenizer, messages, add_generation_prompt, tools, continue_final_message,
                              chat_template_kwargs)

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """ValueError (one line) if the request cannot be served: asked of a live replica (every replica
        of a model has the same settings). Blocking: the server calls it from a worker thread."""
        import ray
        why = ray.get(self.pick().actor.check.remote(prompt_token_ids, params), timeout=60)
        if why:
            raise ValueError(why)

    def pick(self) -> ReplicaState:
        live = [r for r in self.replicas if r.alive]
        if not live:
            raise ReplicaDiedError(f"no replica of `{self.model_name}` is alive")
        return min(live, key=lambda r: (r.device_in_flight, r.in_flight, r.kv_share, r.index))

    async def generate(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[StreamDelta]:
        """AsyncLLM.generate on the chosen replica, its deltas as they come. Leaving early cancels the
        replica's task (which aborts the request there)."""
        import ray
        from ray.exceptions import RayActorError
        params = params or SamplingParams()
        ids = self.encode(prompt)
        key = f"{self.model_name}-{next(self._keys)}" if request_id is None else str(request_id)
        if key in self._running:
            raise ValueError(f"request_id {key!r} is already running")
        rep = self.pick()
        rep.in_flight += 1
        self._running[key] = rep
        gen = rep.actor.generate.options(num_returns="streaming").remote(ids, params, key)
        ended = False
        try:
            async for ref in gen:
                yield await ref
            ended = True
        except RayActorError:
            rep.alive = False
            raise ReplicaDiedError(f"replica {rep.index} of `{self.model_name}` (pid {rep.pid}) died while serving "
                                   "this request") from None
        finally:
            rep.in_flight -= 1
            self._running.pop(key, None)
            if not ended and rep.alive:
                try:
                    ray.cancel(gen)
                except Exception:  # already finished, or the actor is gone: nothing left to stop
                    pass

    def abort(self, request_id: str) -> None:
        rep = self._running.get(str(request_id))
        if rep is not None and rep.alive:
            rep.actor.abort.remote(str(request_id))


def share_devices(states: list[ReplicaState], specs: list[ReplicaSpec]) -> None:
    """Give each replica its peers: those naming the same device on the same node (itself included);
    a replica that names no device is alone on its own."""
    devices: dict = {}
    for s, spec in zip(states, specs):
        devices.setdefault((spec.node, spec.device) if spec.device is not None else ("alone", s.index), []).append(s)
    for peers in devices.values():
        for s in peers:
            s.peers = peers


def summed(stats: list[EngineStats]) -> EngineStats:
    """Replicas' statistics added up (speculation's are per replica: left out of the sum)."""
    keys = [f.name for f in fields(EngineStats) if f.name != "spec"]
    return EngineStats(**{k: sum(getattr(s, k) for s in stats) for k in keys})


class ReplicaSet:
    """Every replica of a placement, launched as Ray actors; `models` maps each served name to its
    ModelReplicas (the server serves them by name; the first is the default), `stats` sums them."""

    def __init__(self, placement: ServePlacement, address: Optional[str] = None, start_timeout_s: float = 900.0,
                 num_cpus: Optional[int] = None):
        try:
            import ray
        except ModuleNotFoundError:
            raise ModuleNotFoundError("serving a placement needs Ray: pip install 'specserve[cluster]'") from None
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            if address:  # an existing cluster (`ray start --head` on one node, `ray start --address` on the others)
                ray.init(address=address, configure_logging=False, log_to_driver=False)
            else:
                local_ray(num_cpus)
        actor_cls = ray.remote(Replica)
        self.states: list[ReplicaState] = []
        for i, spec in enumerate(placement.replicas):
            opts = {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus, "max_concurrency": 1000}
            if spec.node:
                opts["resources"] = {f"node:{spec.node}": 0.01}
            actor = actor_cls.options(**opts).remote(spec.model, placement.engine_kwargs(i), spec.cores)
            self.states.append(ReplicaState(i, spec.model, actor))
        share_devices(self.states, placement.replicas)
        try:
            infos = ray.get([s.actor.describe.remote() for s in self.states], timeout=start_timeout_s)
        except Exception as e:
            self.shutdown()
            why = str(getattr(e, "cause", None) or e).strip().splitlines()
            raise PlacementError(f"a replica did not start: {why[-1] if why else type(e).__name__}") from None
        for s, info in zip(self.states, infos):
            s.pid, s.cores = info["pid"], info["cores"]
            s.stats = EngineStats(kv_blocks_total=info["kv_blocks_total"])
        self.models: dict[str, ModelReplicas] = {}
        for name in placement.models:
            reps = [s for s in self.states if s.model == name]
            self.models[name] = ModelReplicas(name, reps, infos[reps[0].index])
        self.model_name = next(iter(self.models))  # the default model (a request that names none)
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="specserve-replica-watch", daemon=True)
        self._watcher.start()

    @property
    def stats(self) -> EngineStats:
        """Every live replica's statistics added up (/metrics)."""
        return summed([s.stats for s in self.states if s.alive])

    def poll(self) -> None:
        """Refresh every live replica's statistics now; one whose actor has died leaves the routing (one
        that is only slow to answer keeps its last figures)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        live = [s for s in self.states if s.alive]
        refs = [s.actor.stats.remote() for s in live]
        for s, ref in zip(live, refs):
            try:
                s.stats = ray.get(ref, timeout=10)
            except RayActorError:
                s.alive = False
            except GetTimeoutError:  # busy, not dead: keep the last figures
                pass

    def _watch(self) -> None:
        while not self._stop.wait(STATS_EVERY_S):
            try:
                self.poll()
            except Exception:  # Ray shutting down under us: the next shutdown() stops the loop
                if self._stop.is_set():
                    return
                time.sleep(STATS_EVERY_S)

    def shutdown(self) -> None:
        import ray
        if hasattr(self, "_stop"):
            self._stop.set()
            self._watcher.join(5)
        for s in self.states:
            try:
                ray.kill(s.actor)
            except Exception:  # already gone
                pass
        if self._own_ray:
            ray.shutdown()
