"""A node's metrics: a thin facade over a per-node ``prometheus_client`` registry (ADR 0155).

Call sites keep one small API (labels as keyword arguments, values read back for tests); the text
exposition, escaping, process/GC/platform collectors and ``process_start_time_seconds`` come from
prometheus_client. Counter names end in ``_total`` (checked here); no ``_created`` series are
exported (they double the page and Grafana does not use them).

    REG = Registry()
    sent = REG.counter("dekube_p2p_bytes_sent_total", "Bytes sent to peers.", ["protocol"])
    sent.inc(1024, protocol="/yamux/1.0.0")
    REG.gauge("dekube_p2p_peers", "Peers.").set_function(lambda: 3)
    REG.counter_function("dekube_ledger_txs_sent_total", "Txs committed.", lambda: node.sent)
    print(REG.render())
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import prometheus_client
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
DEFAULT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LabelValues = tuple[str, ...]
FunctionValue = float | Mapping[LabelValues, float]
_M = TypeVar("_M")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")     # the classic names every scraper accepts
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class _Wrapped:
    """Common part: the prometheus_client metric, its label names, and a read-back helper."""

    def __init__(self, registry: Registry, name: str, sample: str, labelnames: Sequence[str], metric: Any):
        self._registry = registry
        self.name = name
        self._sample = sample
        self.labelnames = tuple(labelnames)
        self._metric = metric

    def _child(self, labels: Mapping[str, str]) -> Any:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")
        return self._metric.labels(**{k: str(v) for k, v in labels.items()}) if self.labelnames else self._metric

    def _read(self, suffix: str, labels: Mapping[str, str]) -> float:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")
        value = self._registry.prom.get_sample_value(self._sample + suffix, {k: str(v) for k, v in labels.items()})
        return 0.0 if value is None else value


class Counter(_Wrapped):
    """A monotonically increasing count; its name must end in ``_total``."""

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self._child(labels).inc(amount)

    def value(self, **labels: str) -> float:
        return self._read("", labels)


class Gauge(_Wrapped):
    """A value that goes up and down, or is read from a function at render time."""

    def set(self, value: float, **labels: str) -> None:
        self._child(labels).set(float(value))

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).inc(amount)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).dec(amount)

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the (unlabelled) value from ``function`` at each render."""
        if self.labelnames:
            raise ValueError("set_function needs a gauge without labels; use Registry.gauge_function")
        self._metric.set_function(lambda: float(function()))

    def value(self, **labels: str) -> float:
        return self._read("", labels)


class Histogram(_Wrapped):
    """Observations counted into cumulative ``le`` buckets, with ``_sum`` and ``_count``."""

    def observe(self, value: float, **labels: str) -> None:
        self._child(labels).observe(value)

    def count(self, **labels: str) -> float:
        return self._read("_count", labels)

    def sum(self, **labels: str) -> float:
        return self._read("_sum", labels)


class _FunctionCollector:
    """A counter or gauge family whose samples are read from a function at each scrape: the
    function returns one number (no labels) or ``{label values tuple: number}``."""

    def __init__(self, kind: str, name: str, help: str, labelnames: Sequence[str],
                 function: Callable[[], FunctionValue]):
        self.kind, self.name, self.help, self.labelnames, self.function = kind, name, help, tuple(labelnames), function

    def _family(self) -> CounterMetricFamily | GaugeMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name.removesuffix("_total"), self.help, labels=self.labelnames)
        return GaugeMetricFamily(self.name, self.help, labels=self.labelnames)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        value = self.function()
        rows = value.items() if isinstance(value, Mapping) else [((), value)]
        for labels, number in rows:
            labels = tuple(str(v) for v in labels)
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected {len(self.labelnames)} label values, got {labels!r}")
            family.add_metric(list(labels), float(number))
        yield family


class Registry:
    """Named metrics of one node, plus process, GC and platform metrics; ``render()`` gives /metrics."""

    def __init__(self, *, process: bool = True) -> None:
        self.prom = CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=self.prom)
            GCCollector(registry=self.prom)
            PlatformCollector(registry=self.prom)
        self._metrics: dict[str, tuple[str, LabelValues, object]] = {}
        self._lock = threading.Lock()

    def _add(self, kind: str, name: str, labelnames: Sequence[str], make: Callable[[], _M]) -> _M:
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.fullmatch(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r} for {name}")
        with self._lock:
            existing = self._metrics.get(name)
            if existing is not None:
                if existing[:2] == (kind, tuple(labelnames)):
                    return cast(_M, existing[2])
                raise ValueError(f"metric {name} is already registered with another type or labels")
            metric = make()
            self._metrics[name] = (kind, tuple(labelnames), metric)
            return metric

    @staticmethod
    def _check_counter_name(name: str) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter name {name!r} must end in _total")

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        self._check_counter_name(name)
        return self._add("counter", name, labelnames, lambda: Counter(
            self, name, name, labelnames,
            prometheus_client.Counter(name.removesuffix("_total"), help, labelnames, registry=self.prom)))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self._add("gauge", name, labelnames, lambda: Gauge(
            self, name, name, labelnames, prometheus_client.Gauge(name, help, labelnames, registry=self.prom)))

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Iterable[float] = DEFAULT_BUCKETS) -> Histogram:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError("histogram buckets must be distinct and non-empty")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        return self._add("histogram", name, labelnames, lambda: Histogram(
            self, name, name, labelnames,
            prometheus_client.Histogram(name, help, labelnames, buckets=bounds, registry=self.prom)))

    def counter_function(self, name: str, help: str, function: Callable[[], FunctionValue],
                         labelnames: Sequence[str] = ()) -> None:
        """A counter read from ``function`` at each scrape (a count kept elsewhere, never going down)."""
        self._check_counter_name(name)
        collector = _FunctionCollector("counter", name, help, labelnames, function)
        self._add("counter_function", name, labelnames, lambda: self.prom.register(collector))

    def gauge_function(self, name: str, help: str, function: Callable[[], FunctionValue],
                       labelnames: Sequence[str] = ()) -> None:
        """A gauge read from ``function`` at each scrape; with labels it returns {values: number}."""
        collector = _FunctionCollector("gauge", name, help, labelnames, function)
        self._add("gauge_function", name, labelnames, lambda: self.prom.register(collector))

    def sample(self, name: str, **labels: str) -> float | None:
        """One exported sample's value (e.g. ``dekube_p2p_peers``), None when absent."""
        return self.prom.get_sample_value(name, labels)

    def render(self) -> str:
        return generate_latest(self.prom).decode()
