"""The CI pass of the coverage-guided fuzzing (devtools.fuzz, docs/adr/0162).

Without atheris: every seed and every kept corpus input replays cleanly through its decoder (the
corpus is a regression suite). With atheris: every target runs a few thousand inputs mutated
from its corpus under libFuzzer, all in a bounded time, without a crash; and a planted bug is
reported with a reproducer and a non-zero exit.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.fuzz.runner import CORPUS_DIR, REPO_ROOT
from devtools.fuzz.targets import TARGETS, check_one

SHORT_RUNS = 3000
needs_atheris = pytest.mark.skipif(importlib.util.find_spec("atheris") is None,
                                   reason="atheris is not installed (pip install atheris==2.3.0, the [test] extra)")


def test_every_decoder_of_the_issue_has_a_target():
    assert {"tx", "block", "encoding", "consensus_message", "evidence", "lock_proof", "sync_request", "sync_block",
            "txgossip", "certificate", "allreduce_header", "allreduce_meta", "relay_hop", "relay_stop", "dcutr",
            "autonat", "relay_receipt", "voucher", "noise_msg1", "noise_msg2", "noise_msg3", "noise_transport",
            "noise_payload", "yamux", "multistream_listener", "multistream_dialer", "identify", "varint", "protobuf",
            "multiaddr_bytes", "multiaddr_text", "jsonrpc", "segments"} <= set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_and_kept_corpus_replay_cleanly(name):
    loaded = TARGETS[name].load()
    inputs = loaded.seeds()
    corpus = CORPUS_DIR / name
    assert corpus.is_dir() and any(corpus.iterdir()), f"no kept corpus for {name}"
    inputs += [p.read_bytes() for p in sorted(corpus.iterdir())]
    for data in inputs:
        check_one(loaded, data)  # raises on anything but the documented errors


def _fuzz(*args: str, env: dict | None = None, timeout: float = 170) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devtools.fuzz", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})


@needs_atheris
@pytest.mark.timeout(200)
def test_short_pass_over_every_target(tmp_path):
    proc = _fuzz("--all", "--runs", str(SHORT_RUNS), "--jobs", "2", "--no-work", "--max-seconds", "60",
                 "--crashes", str(tmp_path / "crashes"))
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    summary, results = lines[-1], lines[:-1]
    assert summary["summary"] and summary["targets"] == len(TARGETS), proc.stderr[-3000:]
    crashed = [r for r in results if r["crashes"]]
    assert not crashed, json.dumps(crashed, indent=1) + proc.stderr[-3000:]
    assert proc.returncode == 0
    for result in results:
        assert result["runs"] >= SHORT_RUNS or result["seconds"] >= 55, result
        assert result["execs_per_s"] > 0


@needs_atheris
@pytest.mark.timeout(120)
def test_a_crash_leaves_a_reproducer_and_fails(tmp_path):
    env = {"DEKUBE_FUZZ_SELFTEST": "1"}
    corpus, crashes = tmp_path / "corpus", tmp_path / "crashes"
    assert _fuzz("selftest", "--write-seeds", "--corpus", str(corpus), env=env).returncode == 0
    proc = _fuzz("selftest", "--runs", "100", "--no-work", "--corpus", str(corpus), "--crashes", str(crashes), env=env)
    assert proc.returncode == 1
    result = json.loads(proc.stdout.splitlines()[0])
    assert result["crashes"] == 1 and result["reproduces_uninstrumented"] is True
    reproducer = Path(result["reproducers"][0])
    assert reproducer.read_bytes()[:1] == b"!" and reproducer.parent == crashes
    replay = _fuzz("selftest", "--reproduce", str(reproducer), env=env)
    assert replay.returncode == 1 and "planted crash" in replay.stderr
