"""Text data: `task submit --tokenizer byte|char` reaches the task spec and the ledger payload, and the
dry run compares a token model's embedding (and output layer) with the dataset's vocabulary, saying
what to change instead of torch's "index out of range in self"."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from cli.main import main
from ml.compute.task_spec import submit_payload, train_spec_for_task
from ml.train.dry_run import Untrainable, dry_run, embedding_rows
from ml.train.file_dataset import load_file_dataset
from ml.train.model_archive import load_archive, trainable_module
from ml.train.spec import TrainSpec
from tests.cli.conftest import key  # noqa: F401  (a fixture)
from tests.cli.test_task_submit_checks import dead_rpc, one_error
from tests.ml.byo import artifact_id, export, files_of

TEXT = "the quick brown fox jumps over the lazy dog; " * 80   # 28 distinct characters


class CharLM(nn.Module):
    """The issue's model: an embedding sized for a character vocabulary."""

    def __init__(self, vocab: int = 28, out: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.rnn = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, out or vocab)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))
        return self.head(h)


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(TEXT)
    return path


_ARCHIVES: dict[tuple, Path] = {}


def archive(tmp_path, **sizes) -> Path:
    """The CharLM of `sizes` exported once per test session (exporting a GRU takes seconds)."""
    shape = tuple(sorted(sizes.items()))
    if shape not in _ARCHIVES:
        torch.manual_seed(0)
        _ARCHIVES[shape] = export(CharLM(**sizes), torch.zeros(2, 16, dtype=torch.long), tmp_path / "char.pt2")
    return _ARCHIVES[shape]


def spec(model, data, **options):
    return TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model), dataset_artifact=artifact_id(data),
                     **options)


def test_embedding_rows_are_found_through_reshapes(tmp_path):
    module = trainable_module(load_archive(archive(tmp_path)))
    assert embedding_rows(module) == 28


def test_a_byte_tokenized_text_says_use_the_char_tokenizer(tmp_path, text):
    model = archive(tmp_path)
    with pytest.raises(Untrainable) as refused:
        dry_run(spec(model, text), files_of(model, text))
    assert str(refused.value) == ("your model's embedding has 28 rows, the dataset has 256 tokens: use --tokenizer "
                                  "char (the text has 28 distinct characters) or enlarge the embedding to 256")
    assert dry_run(spec(model, text, tokenizer="char"), files_of(model, text))["loss"] > 0


def test_a_too_small_embedding_for_the_characters_says_enlarge_it(tmp_path, text):
    model = archive(tmp_path, vocab=20)
    with pytest.raises(Untrainable, match="embedding has 20 rows, the dataset has 28 tokens .*enlarge the embedding"):
        dry_run(spec(model, text, tokenizer="char"), files_of(model, text))


def test_a_token_file_beyond_the_output_layer_is_named(tmp_path):
    model = archive(tmp_path, vocab=64, out=10)
    data = tmp_path / "tokens.safetensors"
    save_file({"tokens": torch.arange(2000) % 64}, str(data))
    with pytest.raises(Untrainable, match="output layer gives 10 logits per position, the dataset has 64 tokens: "
                                          "enlarge the output layer to 64"):
        dry_run(spec(model, data), files_of(model, data))


def test_task_submit_tokenizer_char_reaches_the_ledger_payload(tmp_path, text, key, capsys):  # noqa: F811
    model = archive(tmp_path)
    code = main(["task", "submit", "--rpc", dead_rpc(), "--key", str(key), "--price", "100", "--model", str(model),
                 "--dataset", str(text), "--workers", "1", "--steps", "2"])
    out, err = capsys.readouterr()
    assert code == 1 and "use --tokenizer char" in one_error(err)
    code = main(["task", "submit", "--rpc", dead_rpc(), "--key", str(key), "--price", "100", "--model", str(model),
                 "--dataset", str(text), "--workers", "1", "--steps", "2", "--tokenizer", "char"])
    out, err = capsys.readouterr()
    assert "dry run: one step ran locally" in out and "dry run" not in err   # it got as far as the ledger
    payload = submit_payload(spec(model, text, tokenizer="char"), 1, 100)
    assert payload["hyperparams"]["tokenizer"] == "char"
    assert train_spec_for_task({**payload, "sync_mode": payload["sync_mode"]}).tokenizer == "char"


def test_tokenizer_on_a_dataset_that_is_not_text_is_refused(tmp_path, key, capsys):  # noqa: F811
    code = main(["task", "submit", "--rpc", dead_rpc(), "--key", str(key), "--price", "100", "--model", "mlp",
                 "--dataset", "digits", "--tokenizer", "char"])
    _, err = capsys.readouterr()
    assert code == 1 and "--tokenizer applies to a text dataset" in one_error(err)
