"""``/metrics``: what the server has done, in Prometheus's text format (``prometheus_client``).

Counted as it happens (a registry per server, so two servers in one process never mix):

* ``ladder_requests_total{route, status}``: HTTP responses, by route and status code;
* ``ladder_prompt_tokens_total``, ``ladder_generation_tokens_total``: tokens in and out;
* ``ladder_prefix_cache_hit_tokens_total`` and ``ladder_prefix_cache_hits_total``: prompt
  tokens found in the prefix cache, and the requests that found any;
* ``ladder_request_finished_total{reason}``: answers by ``finish_reason``;
* ``ladder_draft_tokens_total`` and ``ladder_draft_accepted_tokens_total``: speculative
  decoding's guesses, and those kept (their ratio, the acceptance the speed-up follows);
* ``ladder_time_to_first_token_seconds``, ``ladder_time_per_output_token_seconds`` and
  ``ladder_queue_time_seconds``: histograms, one observation per answer (the engine's
  own timings: the prefill, the mean step after the first token, the wait in the queue);

and read when scraped: ``ladder_requests_waiting`` (submitted, no token yet: queued or
being prefilled), ``ladder_requests_running`` (producing tokens), and
``ladder_kv_blocks_used`` / ``ladder_kv_blocks_total`` where requests share a paged cache.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .worker import Finished, Piece

# Seconds: from a token of a small model on a GPU to a long prompt at level 0.
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)


class Metrics:
    """The counters of one server over ``worker`` (``worker.py``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, worker):
        self.registry = registry = CollectorRegistry()
        self.responses = Counter(
            "ladder_requests", "HTTP responses, by route and status code",
            ["route", "status"], registry=registry,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "ladder_prompt_tokens", "prompt tokens of the answered requests", registry=registry
        )
        self.generated = Counter(
            "ladder_generation_tokens", "tokens generated (completion tokens)", registry=registry
        )
        self.cached_tokens = Counter(
            "ladder_prefix_cache_hit_tokens", "prompt tokens found in the prefix cache",
            registry=registry,
        )  # fmt: skip
        self.cache_hits = Counter(
            "ladder_prefix_cache_hits", "requests that found part of their prompt in the "
            "prefix cache", registry=registry,
        )  # fmt: skip
        self.drafted = Counter(
            "ladder_draft_tokens", "tokens guessed by speculative decoding's drafts",
            registry=registry,
        )  # fmt: skip
        self.accepted = Counter(
            "ladder_draft_accepted_tokens", "guessed tokens the model kept", registry=registry
        )
        self.finished = Counter(
            "ladder_request_finished", "answers by finish_reason", ["reason"], registry=registry
        )
        self.first_token = Histogram(
            "ladder_time_to_first_token_seconds", "from a request's turn to its first token",
            buckets=FIRST_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.per_token = Histogram(
            "ladder_time_per_output_token_seconds", "a request's mean time per token after "
            "its first", buckets=PER_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.queued = Histogram(
            "ladder_queue_time_seconds", "a request's wait in the queue",
            buckets=QUEUE_BUCKETS, registry=registry,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._waiting: set[int] = set()  # ids of the requests with no token yet
        self._running: set[int] = set()
        Gauge(
            "ladder_requests_waiting", "requests submitted with no token yet (queued, or "
            "their prompt being computed)", registry=registry,
        ).set_function(lambda: len(self._waiting))  # fmt: skip
        Gauge(
            "ladder_requests_running", "requests producing tokens", registry=registry
        ).set_function(lambda: len(self._running))
        pool = worker.pool
        if pool is not None:
            Gauge(
                "ladder_kv_blocks_used", "KV-cache blocks held by running requests (a "
                "finished one's prefix stays findable, and counts as free)", registry=registry,
            ).set_function(lambda: pool.blocks - pool.available)  # fmt: skip
            Gauge(
                "ladder_kv_blocks_total", "KV-cache blocks in the pool", registry=registry
            ).set_function(lambda: pool.blocks)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    @property
    def queue(self) -> dict[str, int]:
        """The requests waiting and running now (``/health``'s)."""
        with self._lock:
            return {"waiting": len(self._waiting), "running": len(self._running)}

    def watch(self, deliver):
        """``deliver`` wrapped for one request: its events counted on their way."""
        key = id(deliver)
        with self._lock:
            self._waiting.add(key)

        def counted(event) -> None:
            if isinstance(event, Piece):
                with self._lock:
                    if key in self._waiting:
                        self._waiting.discard(key)
                        self._running.add(key)
            elif isinstance(event, Finished | Exception):
                with self._lock:
                    self._waiting.discard(key)
                    self._running.discard(key)
                if isinstance(event, Finished):
                    self._finished(event)
            deliver(event)

        counted.key = key
        return counted

    def refused(self, counted) -> None:
        """A request ``watch`` saw that the engine did not take (its queue was full)."""
        with self._lock:
            self._waiting.discard(counted.key)

    def _finished(self, done) -> None:
        self.finished.labels(done.finish_reason).inc()
        self.prompt_tokens.inc(done.prompt_tokens)
        self.generated.inc(done.completion_tokens)
        self.drafted.inc(done.drafted_tokens)
        self.accepted.inc(done.accepted_tokens)
        if done.cached_tokens:
            self.cached_tokens.inc(done.cached_tokens)
            self.cache_hits.inc()
        if done.completion_tokens:
            self.first_token.observe(done.first_token_s)
            self.queued.observe(done.queued_s)
        if done.completion_tokens > 1:
            self.per_token.observe(done.per_token_s)


class StatusCounter:
    """ASGI middleware: the status of every response counted in ``metrics`` (``route``: the
    request's path where it is one of ``routes``, else ``other``, so that a scan of random
    paths cannot grow the labels without end)."""

    def __init__(self, app, metrics: Metrics, routes):
        self.app, self.metrics, self.routes = app, metrics, set(routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in self.routes else "other"

        async def sending(message):
            if message["type"] == "http.response.start":
                self.metrics.responses.labels(route, str(message["status"])).inc()
            await send(message)

        return await self.app(scope, receive, sending)
