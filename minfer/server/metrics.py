"""Prometheus metrics of one server instance, served as text at GET /metrics.

Each app gets its own CollectorRegistry: prometheus-client's default registry is global and
refuses a second metric of the same name, and tests build several apps in one process.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# tokens per second spans ~1 (a big model on a CPU) to ~1e5 (prefill on a GPU)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
