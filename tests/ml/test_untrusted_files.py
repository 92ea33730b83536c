"""Untrusted model archives and dataset files are parsed with bounded CPU and memory (docs/adr/0184):
each bomb of the hardening review (issue 22: an exponent tower in a shape expression, a padded weight
file, an inflated fixed member, an .npz that unpacks 1000-fold) is refused quickly with a clear reason
by the owner's dry run and by a compute node's job, whose event loop keeps running; the shape
expressions of stock sequence layers exported with a dynamic batch pass; a file that gets past the
static checks and is still too slow or too big to load is stopped by the child's limits."""
import json
import time
import zipfile

import numpy as np
import pytest
import torch
import torch.nn as nn

from ml.train import sandbox
from ml.train.file_dataset import DatasetError, load_file_dataset
from ml.train.model_archive import ArchiveRefused, check_expression, load_archive
from ml.train.sandbox import Limits, check_archive, check_dataset
from tests.ml.byo import digits_arrays, digits_npz
from tests.ml.untrusted_files import (
    npz_bomb,
    npz_lying_header,
    owner_dry_run,
    rewrite,
    small_archive,
    with_expression,
    worker_job,
)

TOWER = "2**2**2**2**5"
SREPR_TOWER = "Pow(Integer(2), Pow(Integer(2), Pow(Integer(2), Pow(Integer(2), Integer(5)))))"


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clean")
    return small_archive(folder / "cnn.pt2"), digits_npz(folder / "digits.npz")


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("expr", [TOWER, SREPR_TOWER])
def test_an_exponent_tower_is_refused_by_the_dry_run_and_the_worker(tmp_path, clean, expr):
    model, data = clean
    bomb = with_expression(model, tmp_path / "tower.pt2", expr)
    reason = owner_dry_run(bomb, data, within_s=10)
    assert "shape expression" in reason and expr[:20] in reason
    assert "shape expression" in worker_job(tmp_path, bomb, data, within_s=10)


def test_a_padded_weight_file_is_refused(tmp_path, clean):
    model, data = clean

    def pad(name, payload):   # 64 MiB of zeros after the first weight: deflated, the archive stays small
        return payload + bytes(64 << 20) if name == "data/weights/weight_0" else None

    bomb = rewrite(model, tmp_path / "padded.pt2", pad)
    assert bomb.stat().st_size < 1 << 20
    assert "weight_0" in owner_dry_run(bomb, data, within_s=10)
    assert "weight_0" in worker_job(tmp_path, bomb, data, within_s=10)

    def stored_pad(name, payload):   # padded only 2-fold plus 8 KiB: no ratio cap applies, the budget does
        return payload * 2 + bytes(8192) if name == "data/weights/weight_0" else None

    with pytest.raises(ArchiveRefused, match="weight_0 holds .* for tensors that reach"):
        load_archive(rewrite(model, tmp_path / "stored.pt2", stored_pad))


def test_an_inflated_fixed_member_is_refused_before_it_is_read(tmp_path, clean):
    model, data = clean

    def inflate(name, payload):   # "pt2" and 64 MiB of spaces: .strip() would still read "pt2"
        return payload + b" " * (64 << 20) if name == "archive_format" else None

    bomb = rewrite(model, tmp_path / "format.pt2", inflate)
    stored = rewrite(model, tmp_path / "stored.pt2", lambda name, payload: payload + b" " * (2 << 20)
                     if name == "archive_format" else None, zipfile.ZIP_STORED)
    reading = []
    real_open = zipfile.ZipFile.open

    def spy(self, member, *args, **kwargs):
        reading.append(getattr(member, "filename", member))
        return real_open(self, member, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zipfile.ZipFile, "open", spy)
        with pytest.raises(ArchiveRefused, match="archive_format unpacks .* a ratio over 100"):
            load_archive(bomb)
        with pytest.raises(ArchiveRefused, match="archive_format unpacks to 2097155 bytes, over the limit of 16"):
            load_archive(stored)
    assert not any(str(name).endswith("archive_format") for name in reading)
    assert "archive_format" in owner_dry_run(bomb, data, within_s=10)
    assert "archive_format" in worker_job(tmp_path, bomb, data, within_s=10)


def test_an_npz_that_unpacks_a_thousand_fold_is_refused(tmp_path):
    bomb = npz_bomb(tmp_path / "bomb.npz", 128)
    assert bomb.stat().st_size < 1 << 20
    assert "ratio" in owner_dry_run(None, bomb, within_s=10)
    assert "ratio" in worker_job(tmp_path, None, bomb, within_s=10)


def test_an_npy_header_that_lies_about_its_shape_is_refused_before_allocating(tmp_path):
    bomb = npz_lying_header(tmp_path / "header.npz")
    assert "declares (1000000000, 64)" in owner_dry_run(None, bomb, within_s=10)
    assert "declares" in worker_job(tmp_path, None, bomb, within_s=10)


class GRUModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.gru, self.head = nn.Embedding(50, 16), nn.GRU(16, 32, batch_first=True), nn.Linear(32, 50)

    def forward(self, x):
        return self.head(self.gru(self.embed(x))[0])


class AttentionModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(50, 32), nn.LayerNorm(32)
        self.attn, self.head = nn.MultiheadAttention(32, 4, batch_first=True), nn.Linear(32, 50)

    def forward(self, x):
        h = self.norm(self.embed(x))
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        return self.head(self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])


class EncoderModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 32), nn.Linear(32, 50)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, norm_first=True, batch_first=True)

    def forward(self, x):
        return self.head(self.layer(self.embed(x)))


@pytest.mark.parametrize("cls", [GRUModel, AttentionModel, EncoderModel])
def test_sequence_layers_with_a_dynamic_batch_pass_the_shape_expressions(tmp_path, cls):
    torch.manual_seed(0)
    model = cls().eval()
    program = torch.export.export(model, (torch.zeros(4, 16, dtype=torch.long),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    path = tmp_path / "layer.pt2"
    torch.export.save(program, str(path))
    with zipfile.ZipFile(path) as archive:
        graph = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("models/model.json"))))
    expressions = set()

    def walk(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif key == "expr_str":
            expressions.add(value)

    walk(graph)
    assert any(e.startswith("Mul(") for e in expressions)
    for expr in expressions:
        check_expression(expr)
    loaded = load_archive(path).module()
    x = torch.randint(0, 50, (3, 16))
    torch.testing.assert_close(loaded(x), model(x))


def test_a_slow_load_is_stopped_by_the_cpu_limit(tmp_path, clean):
    # nested Max calls within the parser's bounds that sympy flattens and compares pairwise: seconds of
    # CPU on load (an "unknown bomb"); the child's RLIMIT_CPU stops it and the dry run says why
    model, data = clean

    def maximum(first):
        return "Max(" + ", ".join(f"Symbol('s{first + i}', positive=True, integer=True)" for i in range(8)) + ")"

    slow = with_expression(model, tmp_path / "slow.pt2", "Max(" + ", ".join(maximum(8 * j) for j in range(8)) + ")")
    check_expression(json.loads(zipfile.ZipFile(slow).read("cnn/models/model.json"))["graph_module"]["graph"]
                     ["tensor_values"]["x"]["sizes"][0]["as_expr"]["expr_str"])
    started = time.monotonic()
    with pytest.raises(ArchiveRefused, match="more than 1 s of CPU"):
        check_archive(slow, "slow", limits=Limits(cpu_s=1, memory=2 << 30, wall_s=60))
    assert time.monotonic() - started < 30


def test_a_big_load_is_stopped_by_the_memory_limit(tmp_path, clean):
    model, _data = clean
    with pytest.raises(ArchiveRefused, match="more than 8388608 bytes of memory"):
        check_archive(model, "tiny", limits=Limits(cpu_s=30, memory=8 << 20, wall_s=60))
    # a dataset several times the limit: the digits alone (~0.5 MB) can fit in heap the forked
    # checker already has mapped, which RLIMIT_AS does not count, so that load passed now and then
    x, y = digits_arrays()
    big = tmp_path / "big.npz"
    np.savez(big, x=np.concatenate([x] * 12), y=np.concatenate([y] * 12))
    with pytest.raises(DatasetError, match="more than 1048576 bytes of memory"):
        check_dataset(str(big), limits=Limits(cpu_s=30, memory=1 << 20, wall_s=60))


def test_an_allocation_failure_the_loader_did_not_report_is_the_memory_limit(monkeypatch):
    """Under RLIMIT_AS a C function of torch's deserializer can fail an allocation without raising
    MemoryError ("returned NULL without setting an exception", seen in a full run): the child's verdict
    names the memory limit, and a refusal of another kind keeps its own reason."""
    from ml.train import model_archive, sandbox

    def failing(reason):
        def load(path):
            raise model_archive.ArchiveRefused(reason)
        return load

    request = {"kind": "archive", "path": "cnn.pt2", "memory": 123}
    monkeypatch.setattr(model_archive, "load_archive", failing(
        "cnn.pt2: cannot deserialize the exported program: <function LazyMap.__getitem__ at 0x1> returned NULL "
        "without setting an exception"))
    assert sandbox._load(request) == "loading needs more than 123 bytes of memory; refused"
    monkeypatch.setattr(model_archive, "load_archive", failing("cnn.pt2: operator aten.foo is not allowed"))
    assert sandbox._load(request) == "cnn.pt2: operator aten.foo is not allowed"


def test_a_clean_file_is_checked_once_and_then_loads(clean, monkeypatch):
    model, data = clean
    calls = []
    real = sandbox.run_child
    monkeypatch.setattr(sandbox, "run_child", lambda request, limits: calls.append(request) or real(request, limits))
    for _ in range(2):
        check_archive(model, "cnn")
        check_dataset(str(data), artifact_ids=("digits",))
    assert [c["kind"] for c in calls] == ["archive", "dataset"]
