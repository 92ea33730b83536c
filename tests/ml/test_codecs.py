"""Codec round trips, error bounds, determinism, strict headers, NaN/Inf policy and codec choice."""
import pytest
import torch

from ml.codecs import CodecError, choose_codec, codec_names, get_codec, powersgd_rank

ALL = ["fp32", "fp16", "bf16", "int8", "int4", "topk", "sign"]
ALL_WITH_LZ4 = ALL + [name + "+lz4" for name in ALL]
SIZES = [0, 1, 2, 7, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 65537, 70001]


def gaussian(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def test_registry_lists_every_codec():
    assert codec_names() == sorted(ALL)
    with pytest.raises(CodecError):
        get_codec("int3")
    with pytest.raises(CodecError):
        get_codec("int8+zstd")


@pytest.mark.parametrize("name", ALL_WITH_LZ4)
@pytest.mark.parametrize("n", SIZES)
def test_round_trip_shape_size_and_finiteness(name, n):
    codec = get_codec(name)
    x = gaussian(n, seed=n)
    data = codec.encode(x)
    assert isinstance(data, bytes)
    assert len(data) <= codec.max_encoded_size(n)
    if name in ("fp32", "fp16", "bf16", "int8", "int4", "sign"):
        assert len(data) == codec.max_encoded_size(n)
    y = codec.decode(data, n)
    assert y.dtype == torch.float32 and y.shape == (n,)
    assert bool(torch.isfinite(y).all())
    assert torch.equal(codec.decode(memoryview(data), n), y)


def test_fp32_is_lossless_and_decode_does_not_alias_input():
    codec = get_codec("fp32")
    x = gaussian(1000)
    data = bytearray(codec.encode(x))
    y = codec.decode(data, 1000)
    assert torch.equal(y, x)
    data[20:24] = b"\0\0\0\0"
    assert torch.equal(y, x)


@pytest.mark.parametrize(
    "name,bound",
    [("fp16", 5e-4), ("bf16", 4e-3), ("int8", 8e-3), ("int4", 0.12)],
)
def test_relative_error_bounds_on_gaussian(name, bound):
    x = gaussian(200_000, seed=1)
    codec = get_codec(name)
    assert rel_err(codec.decode(codec.encode(x), x.numel()), x) < bound


@pytest.mark.parametrize("name,levels,block", [("int8", 127, 128), ("int4", 7, 64)])
def test_blockwise_error_is_within_half_a_step_of_each_block(name, levels, block):
    x = gaussian(50 * block + 13, seed=2) * torch.logspace(-30, 30, 50 * block + 13)  # scales vary a lot
    codec = get_codec(name)
    y = codec.decode(codec.encode(x), x.numel())
    pad = torch.zeros(51 * block)
    pad[: x.numel()] = x
    absmax = pad.view(-1, block).abs().amax(1).repeat_interleave(block)[: x.numel()]
    step = absmax / levels * (1 + 2**-7)  # bf16 scale rounded up: at most 2^-8 larger
    assert bool(((y - x).abs() <= step / 2 + 1e-45).all())


def test_blockwise_keeps_tiny_and_huge_blocks():
    x = torch.cat([gaussian(128) * 1e-30, gaussian(128) * 1e30, torch.full((128,), 3.0e38)])
    for name in ("int8", "int4"):
        codec = get_codec(name)
        y = codec.decode(codec.encode(x), x.numel())
        assert bool(torch.isfinite(y).all())
        assert rel_err(y[:128], x[:128]) < 0.15
        assert rel_err(y[128:256], x[128:256]) < 0.15
        assert rel_err(y[256:], x[256:]) < 0.15


def test_fp16_saturates_instead_of_overflowing():
    codec = get_codec("fp16")
    y = codec.decode(codec.encode(torch.tensor([1e6, -1e6, 1.0])), 3)
    assert y.tolist() == [65504.0, -65504.0, 1.0]


def test_int4_packs_two_values_per_byte_and_int8_one():
    n = 64 * 1000
    assert len(get_codec("int4").encode(gaussian(n))) == 8 + 2 * 1000 + n // 2
    assert len(get_codec("int8", block=64).encode(gaussian(n))) == 8 + 2 * 1000 + n


def test_topk_keeps_exactly_the_largest_magnitudes():
    x = gaussian(100_000, seed=3)
    codec = get_codec("topk", ratio=0.01)
    y = codec.decode(codec.encode(x), x.numel())
    kept = y != 0
    assert int(kept.sum()) == 1000
    cutoff = torch.topk(x.abs(), 1000).values[-1]
    assert torch.equal(kept, x.abs() >= cutoff)
    assert torch.allclose(y[kept], x[kept], rtol=1e-3, atol=0)


def test_topk_ties_go_to_lower_indices_and_zeros_are_not_sent():
    codec = get_codec("topk", ratio=0.05)
    y = codec.decode(codec.encode(torch.ones(1000)), 1000)
    assert y.nonzero().squeeze(1).tolist() == list(range(50))
    sparse = torch.zeros(1000)
    sparse[[3, 500]] = torch.tensor([1.0, -2.0])
    data = codec.encode(sparse)
    assert torch.equal(codec.decode(data, 1000), sparse)
    assert len(data) < codec.max_encoded_size(1000)


def test_topk_picks_the_smaller_index_format():
    n = 1 << 20
    sparse, dense = get_codec("topk", ratio=0.01), get_codec("topk", ratio=0.2)
    k_sparse, k_dense = sparse.k(n), dense.k(n)
    assert len(sparse.encode(gaussian(n))) == 8 + 4 + 4 * 16 + 2 * k_sparse + 2 * k_sparse  # segmented
    assert len(dense.encode(gaussian(n))) == 8 + 4 + n // 8 + 2 * k_dense  # bitmap


def test_sign_keeps_signs_and_block_mean_magnitude():
    x = gaussian(1000, seed=4)
    codec = get_codec("sign", block=256)
    y = codec.decode(codec.encode(x), 1000)
    assert torch.equal(y >= 0, x >= 0)
    for start in range(0, 1000, 256):
        block = slice(start, min(start + 256, 1000))
        assert torch.allclose(y[block].abs(), x[block].abs().mean().expand_as(y[block]), rtol=4e-3)
    assert 4 * 1000 / len(codec.encode(x)) > 25


def test_lz4_framing_pays_on_sparse_payloads_only():
    sparse = torch.zeros(200_000)
    sparse[::1000] = gaussian(200)
    framed, plain = get_codec("fp16+lz4"), get_codec("fp16")
    assert len(framed.encode(sparse)) < len(plain.encode(sparse)) / 20
    assert torch.equal(framed.decode(framed.encode(sparse), 200_000), plain.decode(plain.encode(sparse), 200_000))
    dense = gaussian(200_000)
    assert len(framed.encode(dense)) == len(plain.encode(dense)) + 12  # stored, header and length only


@pytest.mark.parametrize("name", ALL_WITH_LZ4)
def test_encoding_is_deterministic_across_calls_and_thread_counts(name):
    x = gaussian(300_001, seed=5)
    codec = get_codec(name)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = codec.encode(x)
        torch.set_num_threads(2)
        two = codec.encode(x)
    finally:
        torch.set_num_threads(threads)
    assert one == two == codec.encode(x.clone())


@pytest.mark.parametrize("name", ALL_WITH_LZ4)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_encode_rejects_non_finite_input(name, bad):
    x = gaussian(1000)
    x[777] = bad
    with pytest.raises(CodecError, match="NaN or Inf"):
        get_codec(name).encode(x)


@pytest.mark.parametrize("name", ALL)
def test_encode_rejects_wrong_tensor_kinds(name):
    codec = get_codec(name)
    for bad in (torch.zeros(10, dtype=torch.float64), torch.zeros(2, 5), torch.zeros(20)[::2], [0.0] * 10):
        with pytest.raises(CodecError):
            codec.encode(bad)


@pytest.mark.parametrize("name", ALL_WITH_LZ4)
def test_decode_rejects_mismatched_numel_codec_and_length(name):
    codec = get_codec(name)
    data = codec.encode(gaussian(500))
    with pytest.raises(CodecError):
        codec.decode(data, 499)
    with pytest.raises(CodecError):
        codec.decode(data[:-1], 500)
    with pytest.raises(CodecError):
        codec.decode(data + b"\0", 500)
    with pytest.raises(CodecError):
        codec.decode(b"", 500)
    other = "int8" if name != "int8" else "int4"
    with pytest.raises(CodecError):
        get_codec(other).decode(data, 500)


def test_decode_rejects_other_block_sizes_and_ratios():
    with pytest.raises(CodecError, match="block size"):
        get_codec("int8", block=64).decode(get_codec("int8", block=128).encode(gaussian(300)), 300)
    with pytest.raises(CodecError, match="block size"):
        get_codec("sign", block=64).decode(get_codec("sign", block=256).encode(gaussian(300)), 300)
    with pytest.raises(CodecError):
        get_codec("topk", ratio=0.01).decode(get_codec("topk", ratio=0.1).encode(gaussian(3000)), 3000)


def test_decode_rejects_codes_the_encoder_never_emits():
    int8 = get_codec("int8", block=128)
    data = bytearray(int8.encode(gaussian(128)))
    data[-1] = 0x80  # -128
    with pytest.raises(CodecError, match="-128"):
        int8.decode(bytes(data), 128)
    int4 = get_codec("int4", block=64)
    data = bytearray(int4.encode(gaussian(64)))
    data[-1] &= 0xF0  # nibble 0 (-8)
    with pytest.raises(CodecError, match="nibble"):
        int4.decode(bytes(data), 64)
    data = bytearray(int8.encode(gaussian(128)))
    data[8:10] = b"\x80\x7f"  # scale = +Inf
    with pytest.raises(CodecError, match="scale"):
        int8.decode(bytes(data), 128)


def test_choose_codec_by_size_and_role():
    assert choose_codec(1_000_000, "weight", "int8") == "int8"
    assert choose_codec(100, "weight", "int8") == "fp16"
    assert choose_codec(1_000_000, "bias", "int4") == "fp32"
    assert choose_codec(1_000_000, "norm", "topk") == "fp32"
    assert choose_codec(100, "weight", "fp32") == "fp32"
    assert choose_codec(1_000_000, "embedding", "fp16") == "fp16+lz4"
    assert choose_codec(1_000_000, "weight", "powersgd4", shape=(1000, 1000)) == "powersgd4"
    assert choose_codec(8_000, "weight", "powersgd4", shape=(8000, 1)) == "fp16"
    assert choose_codec(25_000_000, "weight", "powersgd4") == "powersgd4"  # 1-D: viewed as 5000x5000
    assert powersgd_rank("powersgd") == 1 and powersgd_rank("powersgd4") == 4 and powersgd_rank("int8") is None
    for name in choose_codec(1_000_000, "weight", "int8"), choose_codec(1_000_000, "embedding", "bf16"):
        get_codec(name)
    with pytest.raises(ValueError):
        choose_codec(10, "gradient-ish", "int8")
    with pytest.raises(ValueError):
        choose_codec(10, "weight", "int3")


@pytest.mark.parametrize("name", ALL)
def test_tensors_that_require_grad_are_encoded_detached(name):
    x = gaussian(500).requires_grad_()
    codec = get_codec(name)
    assert codec.encode(x) == codec.encode(x.detach())


def canonical_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Reference: the k largest |x| by a full stable sort (ties to lower index), zeros dropped."""
    order = torch.sort(-x.abs(), stable=True).indices[:k]
    order = order[x[order] != 0]
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[order] = True
    return mask


@pytest.mark.parametrize(
    "layout",
    ["ascending", "descending", "periodic", "constant", "mostly_zero", "outlier", "two_levels"],
)
def test_topk_matches_a_full_sort_on_adversarial_layouts(layout):
    n = 300_000
    x = gaussian(n, seed=6)
    if layout == "ascending":
        x = torch.sort(x).values
    elif layout == "descending":
        x = torch.sort(x, descending=True).values
    elif layout == "periodic":
        x = torch.where(torch.arange(n) % 4 == 0, 10.0 + x.abs(), x * 0.01)
    elif layout == "constant":
        x = torch.full((n,), -0.5)
    elif layout == "mostly_zero":
        x = torch.zeros(n)
        x[::997] = gaussian(len(range(0, n, 997)))
    elif layout == "outlier":
        x[12345] = 1e30
    elif layout == "two_levels":
        x = torch.where(torch.arange(n) % 2 == 0, torch.full((n,), 3.0), torch.full((n,), 1.0))
    codec = get_codec("topk", ratio=0.01)
    y = codec.decode(codec.encode(x), n)
    assert torch.equal(y != 0, canonical_topk(x, codec.k(n)))
