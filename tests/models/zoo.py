"""The conformance suite's architectures: models people bring, built as a user would (torch.nn layers,
torchvision's models, Hugging Face transformers built from a small config with random weights), each
with the example input it is exported with and the kind of data it trains on.

Kinds: "tokens" (batch, CONTEXT) token ids -> (batch, CONTEXT, VOCAB) next-token logits, trained on a
`tokens` stream; "vector" (batch, 16) -> (batch, 4) classes; "image" (batch, 3, 32, 32) -> (batch, 10)
classes; "sequence" (batch, 4, 32) -> (batch, 4) classes. A model that needs a library which is not
installed is skipped with the reason (`requires`).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 64
CONTEXT = 16
INPUTS = {"tokens": lambda: torch.randint(0, VOCAB, (4, CONTEXT)), "vector": lambda: torch.rand(4, 16),
          "image": lambda: torch.rand(4, 3, 32, 32), "sequence": lambda: torch.rand(4, 4, 32)}
CLASSES = {"vector": 4, "image": 10, "sequence": 4}


@dataclass(frozen=True)
class Arch:
    name: str
    build: Callable[[], nn.Module]
    kind: str
    requires: str = ""       # a library the model comes from ("torchvision", "transformers")
    fast: bool = False       # in the default (CI) tier; the others run with DEKUBE_SLOW=1

    def example(self) -> torch.Tensor:
        return INPUTS[self.kind]()


def causal_mask(t: int) -> torch.Tensor:
    return torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)


# -- torch.nn -------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class Recurrent(nn.Module):
    """Embedding -> an RNN layer of torch.nn -> a linear head (next-token logits)."""

    def __init__(self, cell: str, **options) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.rnn = getattr(nn, cell)(32, 32, batch_first=True, **options)
        self.head = nn.Linear(32 * (2 if options.get("bidirectional") else 1), VOCAB)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


class CausalMHA(nn.Module):
    """The issue's model: Embedding, LayerNorm, nn.MultiheadAttention with a bool causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, 32))
        self.norm = nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos
        q = self.norm(h)
        a, _ = self.attn(q, q, q, attn_mask=causal_mask(tokens.shape[1]), need_weights=False)
        return self.head(h + a)


class EncoderLM(nn.Module):
    """A token model around one of torch.nn's transformer layers / stacks, with a causal mask (a stack
    is told is_causal=True: without it, export fails on its data-dependent check of the mask)."""

    def __init__(self, body: Callable[[], nn.Module], call: str = "layer") -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.body = body()
        self.head = nn.Linear(32, VOCAB)
        self.call = call

    def forward(self, tokens):
        h = self.embed(tokens)
        mask = causal_mask(tokens.shape[1])
        if self.call == "decoder":
            h = self.body(h, h, tgt_mask=mask)
        elif self.call == "stack":
            h = self.body(h, mask=mask, is_causal=True)
        else:
            h = self.body(h, src_mask=mask)
        return self.head(h)


def encoder_layer(dropout: float = 0.0, **options) -> nn.Module:
    return nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout, batch_first=True, **options)


class BagClassifier(nn.Module):
    """nn.EmbeddingBag (mean) over the token window -> next token of the window (per position)."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens):
        return self.head(self.embed(tokens) + self.bag(tokens).unsqueeze(1))


class NormMLP(nn.Module):
    def __init__(self, norm: Callable[[int], nn.Module], dropout: nn.Module | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), norm(32), nn.SiLU(), dropout or nn.Identity(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class NormCNN(nn.Module):
    def __init__(self, norm: Callable[[int], nn.Module], extra: nn.Module | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), norm(8), nn.Hardswish(),
                                 extra or nn.Identity(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    def forward(self, x):
        return self.net(x)


class Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(4, 8, 5, padding=2), nn.ELU(), nn.MaxPool1d(2),
                                 nn.Conv1d(8, 8, 3, dilation=2), nn.LeakyReLU(0.1), nn.AvgPool1d(2),
                                 nn.AdaptiveMaxPool1d(4), nn.Flatten(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class ConvTransposeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 4, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        h = self.up(F.relu(self.down(x)))
        return self.head(F.adaptive_avg_pool2d(h + x[:, :1], 1).flatten(1))


class PoolingNet(nn.Module):
    """Pooling variants: max with indices unused, avg with ceil mode, LP pooling, adaptive max,
    fractional-free upsampling and pixel shuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pools = nn.ModuleList([nn.MaxPool2d(3, stride=2, padding=1), nn.AvgPool2d(3, stride=2, ceil_mode=True,
                                                                                      count_include_pad=False),
                                    nn.LPPool2d(2, 2), nn.AdaptiveMaxPool2d(4)])
        self.shuffle = nn.PixelShuffle(2)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = nn.Linear(8 * 4 + 2, 10)

    def forward(self, x):
        h = self.conv(x)
        pooled = [F.adaptive_avg_pool2d(p(h), 1).flatten(1) for p in self.pools]
        up = self.up(self.shuffle(h))                         # (batch, 2, 32, 32) -> (batch, 2, 64, 64)
        return self.head(torch.cat([*pooled, up.mean((2, 3))], 1))


class ActivationsMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        acts = [nn.Mish(), nn.SELU(), nn.Softplus(), nn.PReLU(), nn.Hardtanh(), nn.Sigmoid(), nn.Tanh(), nn.GLU(),
                nn.CELU(), nn.Softsign(), nn.Hardsigmoid(), nn.ReLU6(), nn.LogSigmoid(), nn.Tanhshrink()]
        self.layers = nn.ModuleList([nn.Linear(16, 32 if isinstance(a, nn.GLU) else 16) for a in acts])
        self.acts = nn.ModuleList(acts)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for linear, act in zip(self.layers, self.acts):
            x = act(linear(x)) + x
        return F.log_softmax(self.head(x), -1)


class Conv3dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool3d(2)
        self.head = nn.Linear(4 * 1 * 16 * 16, 10)   # (batch, 1, 3, 32, 32) -> (batch, 4, 1, 16, 16)

    def forward(self, x):
        return self.head(self.pool(F.relu(self.conv(x.unsqueeze(1)))).flatten(1))


class DepthwiseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1, groups=3), nn.Conv2d(12, 16, 1), nn.BatchNorm2d(16),
                                 nn.ReLU6(), nn.Dropout2d(0.1), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.2),
                                 nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class SDPAttention(nn.Module):
    """Hand-written attention around F.scaled_dot_product_attention (is_causal), with RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.norm = nn.RMSNorm(32)
        self.qkv = nn.Linear(32, 96)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        b, t, _ = h.shape
        q, k, v = self.qkv(self.norm(h)).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        return self.head(h + a.transpose(1, 2).reshape(b, t, 32))


class TiedLM(nn.Module):
    """Input embedding and output layer sharing one weight (as GPT-2's, tied by the user)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.mix = nn.Linear(32, 32)
        self.head = nn.Linear(32, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


# -- torchvision ----------------------------------------------------------------------------------
def torchvision_models():
    from tests.models.libs import torchvision_or_skip
    return torchvision_or_skip().models


def resnet18() -> nn.Module:
    return torchvision_models().resnet18(num_classes=10)


def mobilenet_v3_small() -> nn.Module:
    return torchvision_models().mobilenet_v3_small(num_classes=10)


def small_vit() -> nn.Module:
    return torchvision_models().VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                  hidden_dim=32, mlp_dim=64, num_classes=10)


# -- Hugging Face transformers ----------------------------------------------------------------------
class Logits(nn.Module):
    """A transformers model as a user wraps it: token ids -> logits (the tensor, not the ModelOutput)."""

    def __init__(self, model: nn.Module, seq2seq: bool = False) -> None:
        super().__init__()
        self.model = model
        self.seq2seq = seq2seq

    def forward(self, tokens):
        if self.seq2seq:
            return self.model(input_ids=tokens, decoder_input_ids=tokens).logits
        return self.model(input_ids=tokens).logits


def hf(config_class: str, model_class: str, seq2seq: bool = False, **config) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        transformers = importlib.import_module("transformers")
        cfg = getattr(transformers, config_class)(**config)
        return Logits(getattr(transformers, model_class)(cfg), seq2seq)
    return build


SMALL = {"vocab_size": VOCAB}
ARCHS: list[Arch] = [
    Arch("mlp", MLP, "vector", fast=True),
    Arch("cnn", CNN, "image", fast=True),
    Arch("gru", lambda: Recurrent("GRU"), "tokens", fast=True),
    Arch("gru-bidirectional-2layer", lambda: Recurrent("GRU", num_layers=2, bidirectional=True), "tokens"),
    Arch("lstm-2layer", lambda: Recurrent("LSTM", num_layers=2), "tokens"),
    Arch("rnn-tanh", lambda: Recurrent("RNN"), "tokens"),
    Arch("rnn-relu", lambda: Recurrent("RNN", nonlinearity="relu"), "tokens"),
    Arch("multihead-attention-causal", CausalMHA, "tokens", fast=True),
    Arch("transformer-encoder-layer", lambda: EncoderLM(lambda: encoder_layer(norm_first=True)), "tokens", fast=True),
    Arch("transformer-encoder-layer-dropout", lambda: EncoderLM(lambda: encoder_layer(0.1, activation="gelu")),
         "tokens"),
    Arch("transformer-encoder", lambda: EncoderLM(lambda: nn.TransformerEncoder(encoder_layer(norm_first=True), 2,
                                                                               enable_nested_tensor=False), "stack"),
         "tokens"),
    Arch("transformer-decoder-layer", lambda: EncoderLM(
        lambda: nn.TransformerDecoderLayer(32, 4, 64, dropout=0.1, batch_first=True), "decoder"), "tokens"),
    Arch("tied-embeddings", TiedLM, "tokens", fast=True),
    Arch("embedding-bag", BagClassifier, "tokens", fast=True),
    Arch("sdpa-rmsnorm", SDPAttention, "tokens"),
    Arch("batchnorm1d", lambda: NormMLP(nn.BatchNorm1d), "vector", fast=True),
    Arch("layernorm-dropout", lambda: NormMLP(nn.LayerNorm, nn.Dropout(0.3)), "vector", fast=True),
    Arch("alpha-dropout", lambda: NormMLP(nn.LayerNorm, nn.AlphaDropout(0.2)), "vector"),
    Arch("activations", ActivationsMLP, "vector"),
    Arch("groupnorm", lambda: NormCNN(lambda c: nn.GroupNorm(2, c)), "image"),
    Arch("instancenorm", lambda: NormCNN(lambda c: nn.InstanceNorm2d(c, affine=True)), "image"),
    Arch("batchnorm2d-dropout2d", lambda: NormCNN(nn.BatchNorm2d, nn.Dropout2d(0.2)), "image"),
    Arch("depthwise-separable", DepthwiseNet, "image"),
    Arch("conv1d-pooling", Conv1dNet, "sequence", fast=True),
    Arch("conv-transpose2d", ConvTransposeNet, "image"),
    Arch("pooling-upsample-pixelshuffle", PoolingNet, "image"),
    Arch("conv3d", Conv3dNet, "image"),
    Arch("torchvision-resnet18", resnet18, "image", "torchvision"),
    Arch("torchvision-mobilenet-v3-small", mobilenet_v3_small, "image", "torchvision"),
    Arch("torchvision-vit", small_vit, "image", "torchvision"),
    Arch("transformers-gpt2", hf("GPT2Config", "GPT2LMHeadModel", n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                 **SMALL), "tokens", "transformers"),
    Arch("transformers-bert", hf("BertConfig", "BertForMaskedLM", hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=32, **SMALL),
         "tokens", "transformers"),
    Arch("transformers-llama", hf("LlamaConfig", "LlamaForCausalLM", hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, **SMALL), "tokens", "transformers"),
    Arch("transformers-t5", hf("T5Config", "T5ForConditionalGeneration", seq2seq=True, d_model=32, d_kv=8, d_ff=64,
                               num_layers=2, num_heads=4, decoder_start_token_id=0, **SMALL),
         "tokens", "transformers"),
]
