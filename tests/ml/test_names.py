"""ml.names (the torch-free list of models, datasets and codecs a task may name) matches the registries."""
from ml.codecs import codec_names
from ml.names import CODEC_NAMES, DATASET_NAMES, MODEL_NAMES, is_codec_name
from ml.registry import DATASETS, MODELS


def test_names_match_the_registries():
    assert list(MODEL_NAMES) == sorted(MODELS)
    assert list(DATASET_NAMES) == sorted(DATASETS)
    assert list(CODEC_NAMES) == codec_names()


def test_codec_names_a_task_may_use():
    for name in ("fp32", "int8+lz4", "topk", "powersgd", "powersgd4"):
        assert is_codec_name(name), name
    for name in ("lz4", "int8+zstd", "int9", "powersgdx", "", "+lz4"):
        assert not is_codec_name(name), name
