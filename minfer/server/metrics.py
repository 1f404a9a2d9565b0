"""Prometheus metrics of one server instance, served as text at GET /metrics.

Each app gets its own CollectorRegistry: prometheus-client's default registry is global and
refuses a second metric of the same name, and tests build several apps in one process.

With a batching worker (`--parallel N`) the engine's state is read at each scrape
(`bind_engine`): running and waiting sequences, KV blocks used and free, the prefix cache's
hit rate; time to first token and the gaps between tokens are histograms per request.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# tokens per second spans ~1 (a big model on a CPU) to ~1e5 (prefill on a GPU)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
# seconds: a GPU decode step is ~5-50 ms, a CPU one ~10-500 ms, a queued first token up to minutes
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5,
                    10, 30, 60, 120)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("minfer_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("minfer_prompt_tokens", "prompt tokens processed (prefill)", registry=r)
        self.generated_tokens = Counter("minfer_generated_tokens", "tokens generated (decode)", registry=r)
        self.in_flight = Gauge("minfer_requests_in_flight",
                               "generation requests being served or waiting in the queue", registry=r)
        self.queued = Gauge("minfer_requests_queued", "generation requests waiting for the worker", registry=r)
        self.cancelled = Counter("minfer_generations_cancelled",
                                 "generations stopped early because the client went away", registry=r)
        self.prompt_tps = Histogram("minfer_prompt_tokens_per_second",
                                    "prefill speed per request: prompt tokens / time to the first token "
                                    "(a prompt prefix still in the KV cache is not recomputed, so counts as fast)",
                                    buckets=_TPS_BUCKETS, registry=r)
        self.generation_tps = Histogram("minfer_generation_tokens_per_second",
                                        "decode speed per request: tokens after the first / time after it",
                                        buckets=_TPS_BUCKETS, registry=r)
        self.ttft = Histogram("minfer_time_to_first_token_seconds",
                              "from the worker taking a request to its first token (queueing in the "
                              "scheduler and prefill included)", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("minfer_inter_token_seconds", "the gaps between consecutive tokens of a request",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.slots = Gauge("minfer_slots", "sequences the engine runs at once (--parallel)", registry=r)
        self.running = Gauge("minfer_sequences_running", "sequences holding KV blocks (prefilling or decoding)",
                             registry=r)
        self.waiting = Gauge("minfer_sequences_waiting",
                             "sequences waiting for a slot or KV blocks (new or preempted)", registry=r)
        self.kv_used = Gauge("minfer_kv_blocks_used", "KV cache blocks held by sequences", registry=r)
        self.kv_free = Gauge("minfer_kv_blocks_free", "KV cache blocks free (or cached and unused)", registry=r)
        self.prefix_hit_rate = Gauge("minfer_prefix_cache_hit_rate",
                                     "prompt tokens served from the prefix cache / prompt tokens looked up",
                                     registry=r)
        self.preemptions = Gauge("minfer_preemptions", "sequences preempted (blocks freed, recomputed later)",
                                 registry=r)
        self._info: Callable[[], dict] | None = None

    def bind_engine(self, info: Callable[[], dict]) -> None:
        """info() -> BatchEngine.slots_info(), read at every scrape."""
        self._info = info

    def observe_finished(self, prompt_seconds: float | None, gaps) -> None:
        if prompt_seconds is not None:
            self.ttft.observe(prompt_seconds)
        for g in gaps or ():
            self.itl.observe(g)

    def render(self) -> bytes:
        if self._info is not None:
            i = self._info()
            self.slots.set(i["slots"])
            self.running.set(i["running"])
            self.waiting.set(i["waiting"])
            self.kv_used.set(i["kv_blocks_used"])
            self.kv_free.set(i["kv_blocks_free"])
            self.prefix_hit_rate.set(i["prefix_hit_tokens"] / i["prefix_lookup_tokens"]
                                     if i["prefix_lookup_tokens"] else 0.0)
            self.preemptions.set(i["preemptions"])
        return generate_latest(self.registry)
