"""Prometheus metrics as the tests read them: every sample of an exposition in a table,
from a process's ``/metrics`` port or from a ``Metrics`` registry in this process."""

from __future__ import annotations

from typing import Protocol

import requests
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, its labels sorted) -> value."""


class Exposing(Protocol):
    def exposition(self) -> bytes: ...


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int) -> Samples:
    """Every sample ``http://127.0.0.1:PORT/metrics`` serves."""
    return parse(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


def exposed(metrics: Exposing) -> Samples:
    """Every sample a registry in this process exposes (``Metrics.exposition``)."""
    return parse(metrics.exposition().decode())
