"""Gradient codecs behind one interface (see ml/codecs/base.py): fp32/fp16/bf16, blockwise
int8/int4, top-k and sign (use them through ErrorFeedback), PowerSGD, lz4 framing, and the
per-tensor choice of codec."""
from ml.names import powersgd_rank

from . import blockwise, float_codecs, lz4_framing, sign, topk  # noqa: F401  (register their codecs)
from .base import Codec, CodecError, codec_names, get_codec
from .error_feedback import ErrorFeedback
from .powersgd import PowerSGD, compression_ratio, from_matrix, matrix_shape, to_matrix, worthwhile
from .selection import choose_codec

__all__ = [
    "Codec",
    "CodecError",
    "ErrorFeedback",
    "PowerSGD",
    "choose_codec",
    "codec_names",
    "compression_ratio",
    "from_matrix",
    "get_codec",
    "matrix_shape",
    "powersgd_rank",
    "to_matrix",
    "worthwhile",
]
