"""A small metrics registry (counters, gauges, histograms with labels) rendered in the
Prometheus text exposition format 0.0.4. Thread-safe: executors may update metrics.

    REG = Registry()
    sent = REG.counter("dekube_bytes_sent_total", "Bytes sent to peers.", ["protocol"])
    sent.inc(1024, protocol="/yamux/1.0.0")
    print(REG.render())
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.fullmatch(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r} for {name}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    """A monotonically increasing count; its name must end in ``_total``."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        if not name.endswith("_total"):
            raise ValueError(f"counter name {name!r} must end in _total")
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels_text(self.labelnames, k)} {_format_value(v)}" for k, v in items]


class Gauge(_Metric):
    """A value that goes up and down, or is read from a function at render time."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}
        self._function: Callable[[], float] | None = None

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the (unlabelled) value from ``function`` at each render."""
        if self.labelnames:
            raise ValueError("set_function needs a gauge without labels")
        self._function = function

    def value(self, **labels: str) -> float:
        if self._function is not None:
            return float(self._function())
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        if self._function is not None:
            return [f"{self.name} {_format_value(float(self._function()))}"]
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels_text(self.labelnames, k)} {_format_value(v)}" for k, v in items]


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with ``_sum`` and ``_count``."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (),
                 buckets: Iterable[float] = DEFAULT_BUCKETS):
        super().__init__(name, help, labelnames)
        bounds = sorted(float(b) for b in buckets)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError("histogram buckets must be distinct and non-empty")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        self._series: dict[tuple[str, ...], list[float]] = {}  # per bucket counts..., sum, count
        if not labelnames:
            self._series[()] = [0.0] * (len(bounds) + 2)

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            series = self._series.setdefault(key, [0.0] * (len(self.bounds) + 2))
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    series[i] += 1
                    break
            series[-2] += value
            series[-1] += 1

    def count(self, **labels: str) -> float:
        with self._lock:
            series = self._series.get(self._key(labels))
            return series[-1] if series else 0.0

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        lines = []
        for key, series in items:
            cumulative = 0.0
            for bound, hits in zip(self.bounds, series):
                cumulative += hits
                le = f'le="{_format_value(bound)}"'
                lines.append(f"{self.name}_bucket{_labels_text(self.labelnames, key, le)} {_format_value(cumulative)}")
            labels = _labels_text(self.labelnames, key)
            lines.append(f"{self.name}_sum{labels} {_format_value(series[-2])}")
            lines.append(f"{self.name}_count{labels} {_format_value(series[-1])}")
        return lines


class Registry:
    """Named metrics of one node; ``render()`` gives the /metrics page."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def _add(self, metric: _Metric) -> _Metric:
        with self._lock:
            existing = self._metrics.get(metric.name)
            if existing is not None:
                if type(existing) is type(metric) and existing.labelnames == metric.labelnames:
                    return existing
                raise ValueError(f"metric {metric.name} is already registered with another type or labels")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help, labelnames))  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help, labelnames))  # type: ignore[return-value]

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Iterable[float] = DEFAULT_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help, labelnames, buckets))  # type: ignore[return-value]

    def render(self) -> str:
        with self._lock:
            metrics = sorted(self._metrics.values(), key=lambda m: m.name)
        lines: list[str] = []
        for metric in metrics:
            lines.extend(metric.header())
            lines.extend(metric.samples())
        return "\n".join(lines) + "\n"
