"""bench/offload.py: the offloading baseline generates what local inference does, and its cold runs
really read the block files from storage (the page cache is dropped after every read)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.offload import block_path, offload_figures, offload_generate, write_blocks
from ml.serve.client import local_generate
from ml.serve.model import DecoderConfig, random_decoder

PROMPT = [5, 17, 99, 3, 250, 42]


def _model():
    return random_decoder(DecoderConfig(vocab_size=256, context=64, width=64, layers=3, heads=4), 7)


def _fstype(path: Path) -> str:
    best, kind = "", ""
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            mount, fstype = fields[4], fields[fields.index("-") + 1]
            if str(path).startswith(mount) and len(mount) >= len(best):
                best, kind = mount, fstype
    return kind


def test_warm_and_cold_offload_generate_the_local_tokens(tmp_path):
    model = _model()
    expected = local_generate(model, PROMPT, 4)
    figures = offload_figures(model, tmp_path, PROMPT, 4, expected)
    assert figures["offload_identical_prefix"] is True
    assert figures["offload_tokens_per_s"] > 0 and figures["offload_warm_tokens_per_s"] > 0
    size = sum(block_path(tmp_path, i).stat().st_size for i in range(3))
    assert figures["offload_disk_read_MB"]["through_files"] == round(4 * size / 1e6, 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
def test_cold_reads_come_from_storage(tmp_path):
    if _fstype(tmp_path) in ("tmpfs", "ramfs", ""):
        pytest.skip(f"{tmp_path} is not disk-backed")
    model = _model()
    write_blocks(model, tmp_path)
    cold = offload_generate(model, tmp_path, PROMPT, 3, cold=True)
    assert cold.disk_bytes is not None
    assert cold.disk_bytes >= 0.9 * cold.file_bytes   # every read went to the disk
    warm = offload_generate(model, tmp_path, PROMPT, 3, cold=False)
    assert warm.tokens == cold.tokens
    assert warm.disk_bytes is not None and warm.disk_bytes < 0.5 * warm.file_bytes   # page cache
