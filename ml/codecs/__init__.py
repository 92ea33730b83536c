"""Gradient codecs behind one interface (see ml/codecs/base.py): fp32/fp16/bf16, blockwise
int8/int4, top-k and sign (with ErrorFeedback), PowerSGD, lz4 framing, and per-tensor choice."""
from . import float_codecs  # noqa: F401  (registers fp32, fp16, bf16)
from .base import Codec, CodecError, codec_names, get_codec

__all__ = ["Codec", "CodecError", "codec_names", "get_codec"]
