"""A task's own model: a torch.export archive loaded without running code it carries, trained across
simulated workers, replayed bit for bit, with deterministic weights out."""
import io
import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, load_file

from devtools.job_replay import replay_job_blocking
from ml.train.inputs import artifact_ids, build_inputs
from ml.train.model_archive import ArchiveRefused, check_expression, load_archive
from ml.train.simulation import build_simulated, train_simulated
from ml.train.spec import InvalidSpec, TrainSpec
from tests.ml.byo import DigitsCNN, artifact_id, digits_cnn_archive, digits_npz, export, files_of


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    d = tmp_path_factory.mktemp("byo")
    model, data = digits_cnn_archive(d / "cnn.pt2"), digits_npz(d / "digits.npz")
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model),
                     dataset_artifact=artifact_id(data), optimizer="sgd", lr=0.1, steps=60, batch_size=32,
                     segment_steps=20, report_every=20)
    return spec, files_of(model, data), d


def test_archive_trains_across_three_workers_and_accuracy_improves(byo):
    spec, files, _ = byo
    before = build_inputs(spec, files).evaluate()
    run = train_simulated(spec, 3, files=files)
    after = run.metrics[0]
    assert all(m == after for m in run.metrics)
    assert after["accuracy"] > 80.0 > before["accuracy"] + 40
    assert after["loss"] < before["loss"] / 2
    hashes = {tuple(t.segment_hashes) for t in run.trainers}
    assert len(hashes) == 1 and len(next(iter(hashes))) == 3


def test_replay_is_bit_identical_to_the_run(byo):
    spec, files, _ = byo
    run = train_simulated(spec, 3, files=files)
    replayed = replay_job_blocking(spec, ["w1", "w2", "w3"], 2, files=files)
    assert all(hashes == run.trainers[0].segment_hashes for hashes in replayed.values())


def test_weights_bytes_are_deterministic_safetensors_of_the_trained_model(byo):
    spec, files, _ = byo
    first = train_simulated(spec, 3, files=files).trainers
    second = train_simulated(spec, 3, files=files).trainers
    assert first[0].weights_bytes() == first[2].weights_bytes() == second[1].weights_bytes()
    untrained = build_simulated(spec, 1, files=files)[0]
    assert untrained.weights_bytes() != first[0].weights_bytes()
    # the owner loads them into their own model class in one line
    owner = DigitsCNN()
    owner.load_state_dict(load(first[0].weights_bytes()))
    x = torch.rand(5, 64)
    assert torch.equal(owner(x), first[0].model(x))


def test_weights_bytes_survive_a_file_round_trip(byo, tmp_path):
    spec, files, _ = byo
    trainer = build_simulated(spec, 1, files=files)[0]
    (tmp_path / "w.safetensors").write_bytes(trainer.weights_bytes())
    loaded = load_file(str(tmp_path / "w.safetensors"))
    assert sorted(loaded) == ["conv.bias", "conv.weight", "fc.bias", "fc.weight"]


def test_init_seed_reinitialises_deterministically(byo):
    spec, files, _ = byo
    from dataclasses import replace
    archive = build_inputs(spec, files).model.state_dict()
    seeded = [build_inputs(replace(spec, init="seed", seed=s), files).model.state_dict() for s in (1, 1, 2)]
    assert all(torch.equal(seeded[0][k], seeded[1][k]) for k in archive)
    assert not torch.equal(seeded[0]["fc.weight"], seeded[2]["fc.weight"])
    assert not torch.equal(seeded[0]["fc.weight"], archive["fc.weight"])
    assert torch.all(seeded[0]["fc.bias"] == 0)
    bound = 1 / (8 * 4 * 4) ** 0.5
    assert float(seeded[0]["fc.weight"].abs().max()) <= bound


def test_workers_do_not_share_the_archive_weights(byo):
    spec, files, _ = byo
    a, b = build_simulated(spec, 2, files=files)
    with torch.no_grad():
        a.params[0].add_(1.0)
    assert not torch.equal(a.params[0], b.params[0])


def test_artifact_ids_and_spec_pairing(byo):
    spec, _, _ = byo
    assert artifact_ids(spec) == [spec.model_artifact, spec.dataset_artifact]
    assert artifact_ids(TrainSpec()) == []
    with pytest.raises(InvalidSpec):
        TrainSpec(model="pt2")                                  # no archive named
    with pytest.raises(InvalidSpec):
        TrainSpec(model_artifact="ab" * 32)                     # an archive with a registry model
    with pytest.raises(InvalidSpec):
        TrainSpec(model="pt2", model_artifact="AB" * 32)        # not lowercase hex


# -- refusals -------------------------------------------------------------------------------------------

def test_a_pickled_model_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "model.pt2"
    path.write_bytes(pickle.dumps(DigitsCNN()))
    with pytest.raises(ArchiveRefused, match="pickle"):
        load_archive(path)
    torch.save(DigitsCNN(), str(path))                          # torch.save's zip format
    with pytest.raises(ArchiveRefused, match="torch.save checkpoint"):
        load_archive(path)
    path.write_bytes(b"just some bytes")
    with pytest.raises(ArchiveRefused, match="not a torch.export archive"):
        load_archive(path)


@torch.library.custom_op("dekube_test::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_scale.register_fake
def _(x):
    return torch.empty_like(x)


class Scaler(torch.nn.Module):
    def forward(self, x):
        return _scale(x)


class WithCustomOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)
        self.block = torch.nn.Sequential(torch.nn.ReLU(), Scaler())

    def forward(self, x):
        return self.block(self.fc(x))


def test_an_archive_calling_a_custom_op_is_refused_naming_it_its_module_and_the_fix(tmp_path):
    path = export(WithCustomOp(), torch.rand(4, 64), tmp_path / "custom.pt2")
    with pytest.raises(ArchiveRefused) as refused:
        load_archive(path)
    message = str(refused.value)
    assert "dekube_test.scale in module block.1 (Scaler)" in message
    assert "workers run only torch's own (aten) operators" in message


class WithDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        return torch.nn.functional.dropout(self.fc(x), 0.5, training=True)


def test_dropout_is_seeded_per_step_and_off_in_evaluation(tmp_path):
    from ml.train.model_archive import trainable_module
    from ml.train.op_randomness import evaluating, step_randomness
    module = trainable_module(load_archive(export(WithDropout(), torch.rand(4, 64), tmp_path / "dropout.pt2")))
    x = torch.rand(8, 64)
    with step_randomness(7, 0, 3):
        first = module(x)
    with step_randomness(7, 0, 3):
        again = module(x)
    with step_randomness(7, 0, 4):
        next_step = module(x)
    with step_randomness(7, 1, 3):
        other_rank = module(x)
    assert torch.equal(first, again) and (first == 0).any()
    assert not torch.equal(first, next_step) and not torch.equal(first, other_rank)
    with evaluating():
        plain = module(x)
    weights = module.state_dict()
    assert torch.equal(plain, torch.nn.functional.linear(x, weights["fc.weight"], weights["fc.bias"]))
    state = torch.random.get_rng_state()
    with step_randomness(7, 0, 3):
        module(x)
    assert torch.equal(torch.random.get_rng_state(), state)   # the process's generator is left as it was


def _rewrite_graph(src: Path, dst: Path, edit) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("models/model.json"):
                data = json.dumps(edit(json.loads(data))).encode()
            zout.writestr(info, data)
    return dst


def test_crafted_call_targets_names_and_expressions_are_refused(tmp_path):
    good = digits_cnn_archive(tmp_path / "good.pt2")

    def target(graph):
        graph["graph_module"]["graph"]["nodes"][0]["target"] = "torch.load"
        return graph

    def name(graph):
        graph["graph_module"]["graph"]["nodes"][0]["name"] = "x = __import__('os').system('true'); y"
        return graph

    def expr(graph):
        sizes = graph["graph_module"]["graph"]["tensor_values"]["x"]["sizes"]
        sizes[0]["as_expr"]["expr_str"] = "__import__('os').system('true')"
        return graph

    for edit, message in ((target, "torch.load"), (name, "bad name"), (expr, "shape expression")):
        with pytest.raises(ArchiveRefused, match=message):
            load_archive(_rewrite_graph(good, tmp_path / f"{edit.__name__}.pt2", edit))


def test_pickled_payloads_and_native_code_in_an_archive_are_refused(tmp_path):
    good = digits_cnn_archive(tmp_path / "good.pt2")
    flagged = tmp_path / "flagged.pt2"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(flagged, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                next(iter(config["config"].values()))["use_pickle"] = True
                data = json.dumps(config).encode()
            zout.writestr(info, data)
    with pytest.raises(ArchiveRefused, match="pickle"):
        load_archive(flagged)
    native = tmp_path / "native.pt2"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(native, "w") as zout:
        prefix = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        zout.writestr(f"{prefix}/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(ArchiveRefused, match="AOTInductor"):
        load_archive(native)


def test_sample_inputs_are_never_unpickled(tmp_path, monkeypatch):
    good = digits_cnn_archive(tmp_path / "good.pt2")
    calls = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real_load(*a, **k))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append("pickle") or None)
    load_archive(good)
    assert calls == []


@pytest.mark.parametrize("expr", ["Symbol('s77', positive=True, integer=True)",
                                  "Add(Mul(Integer(2), Symbol('s0', positive=True, integer=True)), "
                                  "FloorDiv(Symbol('s1', positive=True, integer=True), Integer(4)))",
                                  "Max(Integer(1), Symbol('s3', positive=True, integer=True))"])
def test_plain_shape_expressions_pass(expr):
    check_expression(expr)


@pytest.mark.parametrize("expr", ["s0.__class__", "Symbol('x; import os')", "[s for s in ()]", "lambda: 1",
                                  "getattr(s0, 'x')", "2*s0 + FloorDiv(s1, 4)", "2**2**2**2**5"])
def test_other_shape_expressions_are_refused(expr):
    with pytest.raises(ArchiveRefused):
        check_expression(expr)


def test_a_model_stream_is_not_read_through_torch_load(tmp_path):
    buffer = io.BytesIO()
    torch.save({"weight": torch.ones(2)}, buffer)
    path = tmp_path / "weights.pt"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(ArchiveRefused):
        load_archive(path)


def test_a_transformer_archive_passes_the_allow_list(tmp_path):
    from ml.registry.models import CharTransformer
    from ml.train.model_archive import input_shape, trainable_module
    torch.manual_seed(0)
    path = export(CharTransformer(65, 32, width=32), torch.zeros(2, 32, dtype=torch.long), tmp_path / "lm.pt2")
    program = load_archive(path)
    assert input_shape(program) == [None, 32]
    assert trainable_module(program)(torch.zeros(3, 32, dtype=torch.long)).shape == (3, 32, 65)


def test_progress_reports_carry_held_out_metrics_every_eval_every_steps(byo):
    from dataclasses import replace

    from ml.train.progress import ProgressFeed
    spec, files, _ = byo
    feed = ProgressFeed()
    reports = []
    feed.subscribe(reports.append)
    run = train_simulated(replace(spec, eval_every=40), 2, feed=feed, files=files)
    by_step = {(r.rank, r.step): r.metrics for r in reports}
    assert by_step[(0, 20)] == {} and "accuracy" in by_step[(0, 40)] and by_step[(1, 60)] == run.metrics[1]
    plain = train_simulated(spec, 2, files=files)
    assert plain.trainers[0].segment_hashes == run.trainers[0].segment_hashes   # evaluating changes nothing


class WithBatchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


def test_evaluation_leaves_batch_norm_statistics_as_they_were(tmp_path):
    import asyncio
    model, data = export(WithBatchNorm(), torch.rand(4, 64), tmp_path / "bn.pt2"), digits_npz(tmp_path / "d.npz")
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model), dataset_artifact=artifact_id(data),
                     optimizer="sgd", lr=0.1, steps=20, segment_steps=10, report_every=10)
    trainer = build_simulated(spec, 1, files=files_of(model, data))[0]
    before = trainer.weights_bytes()
    asyncio.run(trainer.evaluate())
    assert trainer.weights_bytes() == before
    assert "bn.running_mean" in load(before)
