"""A model's weights as safetensors bytes, deterministic: identical weights give identical bytes, so
workers that agree produce the same weights artifact id.

Tensors are taken from the state dict (parameters and buffers), copied to CPU, made contiguous and
unaliased; safetensors writes them in a fixed order with a header of sorted keys and no metadata.
The owner loads them with `model.load_state_dict(safetensors.torch.load_file("weights.safetensors"))`.
"""
from __future__ import annotations

import torch


def weights_bytes(model: torch.nn.Module) -> bytes:
    from safetensors.torch import save

    tensors = {name: tensor.detach().to("cpu", copy=True).contiguous()
               for name, tensor in sorted(model.state_dict().items())}
    return save(tensors)
