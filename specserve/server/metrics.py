"""Prometheus metrics (/metrics), named like vLLM's with a `specserve:` prefix.

Request latencies are observed by the server as deltas stream out (RequestTracker); engine state (queue, batch, KV
blocks, speculation) is read at scrape time from the snapshot the engine thread publishes after
every step (AsyncLLM.stats), so a scrape never waits for a step.
"""
from __future__ import annotations

import time
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class EngineCollector:
    """Gauges and counters from AsyncLLM.stats, read at scrape time."""

    def __init__(self, llm):
        self.llm = llm

    def collect(self):
        st = self.llm.stats
        g = lambda name, doc, v: _gauge(f"specserve:{name}", doc, v)  # noqa: E731
        yield g("num_requests_waiting", "Requests queued, not started yet.", st.waiting)
        yield g("num_requests_running", "Requests in the running batch.", st.running)
        yield g("kv_cache_usage_ratio", "Share of KV blocks in use (0..1).",
                st.kv_blocks_used / st.kv_blocks_total if st.kv_blocks_total else 0.0)
        yield g("kv_blocks_in_use", "KV blocks in use.", st.kv_blocks_used)
        yield g("cpu_threads", "CPU threads the last step used (fewer while other processes compete).", st.threads)
        for name, doc, v in (("engine_steps", "Engine steps run.", st.steps),
                             ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", st.prefix_cache_queries),
                             ("prefix_cache_hits", "Prompt tokens found in the prefix cache (prefill skipped).",
                              st.prefix_cache_hits)):
            c = CounterMetricFamily(f"specserve:{name}", doc)
            c.add_metric([], v)
            yield c
        spec = st.spec
        if spec is None:
            return
        yield g("spec_decode_speculating", "1 if the last decode step verified drafts (the cost model's live choice).",
                1.0 if spec["speculating"] else 0.0)
        yield g("spec_decode_tokens_per_target_step", "Tokens per sequence per target step in decode.",
                spec["tokens_per_target_step"] or 0.0)
        yield g("spec_decode_acceptance_rate", "Accepted over drafted tokens.", spec["acceptance_rate"] or 0.0)
        by_pos = GaugeMetricFamily("specserve:spec_decode_acceptance_rate_by_position",
                                   "Acceptance rate of the i-th draft token (0-based), given it was drafted.",
                                   labels=["position"])
        for i, rate in enumerate(spec["acceptance_by_position"]):
            by_pos.add_metric([str(i)], rate)
        yield by_pos
        for name, key in (("spec_decode_num_draft_tokens", "drafted"), ("spec_decode_num_accepted_tokens", "accepted"),
                          ("spec_decode_fallback_steps", "fallback_steps")):
            c = CounterMetricFamily(f"specserve:{name}", f"Speculative decoding: {key.replace('_', ' ')}.")
            c.add_metric([], spec[key])
            yield c


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    m = GaugeMetricFamily(name, doc)
    m.add_metric([], float(value))
    return m


class ServerMetrics:
    def __init__(self, llm):
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("specserve:time_to_first_token_seconds", "Time from arrival to the first token.",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram("specserve:time_per_output_token_seconds", "Per request: (last - first token) / (tokens - 1).",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("specserve:inter_token_latency_seconds", "Time between streamed tokens of a sample.",
                             buckets=_LATENCY, registry=r)
        self.e2e = Histogram("specserve:e2e_request_latency_seconds", "Arrival to the last token.",
                             buckets=_LATENCY, registry=r)
        self.finished = Counter("specserve:request_success", "Finished requests by reason.", ["finished_reason"], registry=r)
        self.prompt_tokens = Counter("specserve:prompt_tokens", "Prompt tokens of accepted requests.", registry=r)
        self.generation_tokens = Counter("specserve:generation_tokens", "Tokens generated.", registry=r)
        self.errors = Counter("specserve:request_errors", "Requests answered with an error, by HTTP status.", ["status"],
                              registry=r)
        # set to read the server's count at scrape time (Serving): a hung-up stream's slot comes back when
        # its response has unwound, a moment after the engine dropped the request
        self.requests_in_flight = Gauge("specserve:http_requests_in_flight",
                                        "HTTP requests admitted and not yet answered (the --max-concurrent-requests count).",
                                        registry=r)
        r.register(EngineCollector(llm))


class RequestTracker:
    """Latency metrics of one HTTP request as its deltas pass (both endpoints, streamed or not)."""

    def __init__(self, metrics: ServerMetrics, prompt_tokens: int):
        self.metrics = metrics
        self.t0 = time.perf_counter()
        self.first: Optional[float] = None
        self.last: dict[int, float] = {}
        self.tokens = 0
        metrics.prompt_tokens.inc(prompt_tokens)

    def see(self, choice: int, d) -> None:
        """d: a StreamDelta of the given choice."""
        m, now = self.metrics, time.perf_counter()
        if d.token_ids:
            if self.first is None:
                self.first = now
                m.ttft.observe(now - self.t0)
            if choice in self.last:
                m.itl.observe(now - self.last[choice])
            self.last[choice] = now
            self.tokens += len(d.token_ids)
            m.generation_tokens.inc(len(d.token_ids))
        if d.finished:
            m.finished.labels(d.finish_reason).inc()

    def done(self) -> None:
        now = time.perf_counter()
        self.metrics.e2e.observe(now - self.t0)
        if self.first is not None and self.tokens > 1:
            self.metrics.tpot.observe((max(self.last.values()) - self.first) / (self.tokens - 1))
