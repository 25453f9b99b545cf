"""The web UI's Prometheus metrics: requests answered, by endpoint, method and status, and how long each took.

`/metrics` is open, like `/healthz`: it holds request counts and durations by route name, never a billing figure or
an id. Under gunicorn each worker is a process of its own: `adbill web` points `PROMETHEUS_MULTIPROC_DIR` at a
fresh folder before any worker starts, and a scrape adds up every worker's figures (prometheus_client's
multiprocess mode). Endpoints are Flask's route names, so the label set is bounded whatever URLs clients ask for.
"""

from __future__ import annotations

import os
import time

from flask import Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest

REQUESTS = Counter("adbill_web_requests", "HTTP requests answered", ["endpoint", "method", "status"])
DURATION = Histogram(
    "adbill_web_request_duration_seconds",
    "Time to answer an HTTP request",
    ["endpoint", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def instrument(app: Flask) -> None:
    """Count and time every request the app answers."""

    @app.before_request
    def started() -> None:
        g.metrics_started = time.perf_counter()

    @app.after_request
    def answered(response: Response) -> Response:
        endpoint = request.endpoint or "unmatched"
        REQUESTS.labels(endpoint, request.method, str(response.status_code)).inc()
        began = g.get("metrics_started")
        if began is not None:
            DURATION.labels(endpoint, request.method).observe(time.perf_counter() - began)
        return response


def scrape() -> Response:
    """The metrics in Prometheus's text format: this process's, or every gunicorn worker's added up."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
    return Response(generate_latest(REGISTRY), mimetype=CONTENT_TYPE_LATEST)
