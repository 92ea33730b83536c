"""The metrics facade over prometheus_client renders valid text exposition (checked with its parser),
keeps its small call-site API and refuses misuse."""
import math

import pytest

from node.metrics import Registry


def build():
    reg = Registry()
    sent = reg.counter("dekube_bytes_sent_total", 'Bytes "sent"\nto peers \\ total.', ["protocol"])
    sent.inc(1024, protocol="/yamux/1.0.0")
    sent.inc(1, protocol='we"ird\\label\n')
    gauge = reg.gauge("dekube_peers", "Connected peers.")
    gauge.set(3)
    gauge.dec()
    reg.gauge("dekube_uptime_seconds", "Uptime.").set_function(lambda: 12.5)
    hist = reg.histogram("dekube_latency_seconds", "Latency.", buckets=(0.1, 1.0))
    for value in (0.05, 0.5, 0.5, 3.0):
        hist.observe(value)
    return reg


def test_text_format_lines():
    text = build().render()
    assert text.endswith("\n")
    assert "# HELP dekube_bytes_sent_total Bytes \"sent\"\\nto peers \\\\ total." in text
    assert "# TYPE dekube_bytes_sent_total counter" in text
    assert 'dekube_bytes_sent_total{protocol="/yamux/1.0.0"} 1024.0' in text
    assert 'dekube_bytes_sent_total{protocol="we\\"ird\\\\label\\n"} 1.0' in text
    assert "dekube_peers 2.0" in text and "dekube_uptime_seconds 12.5" in text
    assert "# TYPE dekube_latency_seconds histogram" in text
    assert 'dekube_latency_seconds_bucket{le="0.1"} 1.0' in text
    assert 'dekube_latency_seconds_bucket{le="1.0"} 3.0' in text
    assert 'dekube_latency_seconds_bucket{le="+Inf"} 4.0' in text
    assert "dekube_latency_seconds_sum 4.05" in text and "dekube_latency_seconds_count 4.0" in text
    assert "_created" not in text
    assert "process_start_time_seconds" in text and "python_gc_collections_total" in text


def test_prometheus_parser_accepts_output():
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name: f for f in parser.text_string_to_metric_families(build().render())}
    assert families["dekube_bytes_sent"].type == "counter"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("dekube_bytes_sent_total", (("protocol", 'we"ird\\label\n'),))] == 1
    assert samples[("dekube_latency_seconds_bucket", (("le", "+Inf"),))] == 4
    assert families["dekube_latency_seconds"].type == "histogram"
    assert families["dekube_peers"].type == "gauge"


def test_misuse_is_rejected():
    reg = Registry()
    with pytest.raises(ValueError, match="_total"):
        reg.counter("dekube_things", "x")
    with pytest.raises(ValueError, match="invalid metric name"):
        reg.gauge("bad-name", "x")
    with pytest.raises(ValueError, match="invalid label"):
        reg.histogram("h", "x", ["le"])
    counter = reg.counter("c_total", "x", ["a"])
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1, a="1")
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc(b="1")
    assert reg.counter("c_total", "x", ["a"]) is counter  # same definition: shared
    with pytest.raises(ValueError, match="already registered"):
        reg.gauge("c_total", "x")


def test_special_values():
    reg = Registry()
    g = reg.gauge("g", "x", ["k"])
    g.set(math.inf, k="a")
    g.set(math.nan, k="b")
    g.set(-math.inf, k="c")
    text = reg.render()
    assert 'g{k="a"} +Inf' in text and 'g{k="b"} NaN' in text and 'g{k="c"} -Inf' in text


def test_values_read_back_and_function_metrics():
    reg = Registry(process=False)
    counter = reg.counter("c_total", "x", ["a"])
    counter.inc(2, a="1")
    assert counter.value(a="1") == 2 and counter.value(a="2") == 0
    hist = reg.histogram("h_seconds", "x")
    hist.observe(0.3)
    assert hist.count() == 1 and hist.sum() == 0.3
    state = {"n": 5}
    reg.counter_function("f_total", "x", lambda: {("in",): state["n"]}, ["dir"])
    reg.gauge_function("g", "x", lambda: 7)
    state["n"] = 9   # read at scrape time
    assert reg.sample("f_total", dir="in") == 9 and reg.sample("g") == 7
    assert "process_" not in reg.render()
    with pytest.raises(ValueError, match="_total"):
        reg.counter_function("f", "x", lambda: 1)
