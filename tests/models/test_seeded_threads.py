"""A dropout step's draws are its own while other threads of the process use torch's generators
(docs/adr/0196). torch's default generator is process-wide: a second worker's step, an evaluation or
a registry model's initialisation seeding it in another thread between a step's seeding and its
dropout draws gave that step the other thread's masks, and a verifier replaying the step alone
found a different gradient (the flaky test_a_verifier_replays_every_segment_of_a_dropout_model).

Each test forces that interleaving: the step pauses at the start of its forward pass (a forward
pre-hook, inside its seeded block) until the intruder thread is inside its own seeded block or a
second has passed; the intruder stays there until the step is done. Before the fix the intruder got
in and both computed from the wrong generator state; now it waits for the step, and both compute what
they compute alone.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from ml.registry import MODELS, build_model, get_dataset
from ml.registry.models import CharTransformer, DigitsMLP
from ml.train.file_dataset import load_file_dataset
from ml.train.model_archive import load_archive, trainable_module
from ml.train.op_randomness import draws_randomness, eval_randomness, step_randomness
from ml.train.simulation import build_simulated
from tests.ml.byo import DigitsCNN, export, files_of
from tests.models.test_conformance import dataset_for, export_as_a_user, spec_for
from tests.models.zoo import ARCHS

STEP = 1
PAUSE = 1.0   # how long the step waits for an intruder that (after the fix) cannot get in


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("threads")
    arch = next(a for a in ARCHS if a.name == "layernorm-dropout")
    _, model = export_as_a_user(arch, folder / "model.pt2")
    data = dataset_for(arch.kind, folder / "data.npz")
    spec = replace(spec_for(model, data), steps=4, segment_steps=2)
    return build_simulated(spec, 2, files=files_of(model, data))[0]


def _gradients(trainer) -> list[torch.Tensor]:
    trainer._gradients(STEP)
    return [p.grad.clone() for p in trainer.params]


def _other_worker(seed: int, inside: threading.Event, done: threading.Event) -> torch.Tensor:
    with step_randomness(seed, 1, STEP):
        inside.set()
        done.wait(10)
        return torch.rand(16)


def _evaluation(seed: int, inside: threading.Event, done: threading.Event) -> torch.Tensor:
    with eval_randomness(seed):
        inside.set()
        done.wait(10)
        return torch.rand(16)


def _registry_model(seed: int, inside: threading.Event, done: threading.Event) -> list[torch.Tensor]:
    def factory(dataset):   # pauses between seeding and drawing the initial weights
        inside.set()
        done.wait(10)
        return DigitsMLP(dataset.num_features, (16,), dataset.num_classes)

    MODELS["paused-digits-mlp"] = factory
    try:
        return list(build_model("paused-digits-mlp", get_dataset("digits"), seed).state_dict().values())
    finally:
        del MODELS["paused-digits-mlp"]


def _alone(intruder: Callable, seed: int):
    inside, done = threading.Event(), threading.Event()
    done.set()
    return intruder(seed, inside, done)


def _same(a, b) -> bool:
    a = a if isinstance(a, list) else [a]
    b = b if isinstance(b, list) else [b]
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("intruder", [_other_worker, _evaluation, _registry_model],
                         ids=["another-worker-step", "evaluation", "registry-model-init"])
def test_a_dropout_step_and_another_thread_using_the_generator_each_draw_their_own(trainer, intruder):
    seed = trainer.spec.seed
    expected_gradients, expected_intruder = _gradients(trainer), _alone(intruder, seed)
    inside, done, result = threading.Event(), threading.Event(), {}

    def pause_in_forward(module, args):   # inside the step's seeded block, before its dropout draws
        step_entered.set()
        inside.wait(PAUSE)

    step_entered = threading.Event()

    def intrude():
        step_entered.wait(10)
        result["value"] = intruder(seed, inside, done)

    thread = threading.Thread(target=intrude)
    thread.start()
    hook = trainer.model.register_forward_pre_hook(pause_in_forward)
    try:
        gradients = _gradients(trainer)
    finally:
        hook.remove()
        done.set()
        thread.join(10)
    assert not thread.is_alive()
    assert _same(gradients, expected_gradients), "the step drew another thread's dropout masks"
    assert _same(result["value"], expected_intruder), "the other thread drew from the step's generator"


def test_a_dropout_graph_draws_randomness_and_a_plain_one_does_not(trainer, tmp_path):
    assert draws_randomness(trainer.model)
    plain = load_archive(export(DigitsCNN(), torch.rand(4, 64), tmp_path / "plain.pt2"))
    assert not draws_randomness(trainable_module(plain))
    noisy = load_archive(export(_Noisy(), torch.rand(4, 8), tmp_path / "noisy.pt2"))   # rand has no off switch
    assert draws_randomness(trainable_module(noisy))
    assert draws_randomness(torch.nn.Linear(2, 2))   # a module built by Python code is assumed to draw


class _Noisy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x + 0.01 * torch.rand_like(x))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_registry_models_that_say_they_draw_no_randomness_do_not(name):
    """Their steps skip the seeded generator (and its lock), so the claim must hold: the global
    generator's state neither changes their forward/backward nor is moved by it."""
    dataset = get_dataset({"digits-mlp": "digits", "char-transformer": "shakespeare"}[name])
    model = build_model(name, dataset, 7)
    assert type(model) in (DigitsMLP, CharTransformer) and not draws_randomness(model)
    x, y = dataset.train_batch(0, 0, 1, 4, 7)
    results = []
    for global_seed in (1, 2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(global_seed)
            before = torch.random.get_rng_state()
            model.zero_grad()
            loss = dataset.loss(model(x), y)
            loss.backward()
            assert torch.equal(torch.random.get_rng_state(), before)
            results.append([loss.detach(), *(p.grad.clone() for p in model.parameters())])
    assert _same(results[0], results[1])
