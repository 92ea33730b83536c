"""Which operators a task's exported graph may call (docs/adr/0185), and what a refusal says.

The allow-list is data: aten operators (any overload) by family, covering what torch.nn, torchvision
and Hugging Face transformers models lower to under `torch.export.export`. Every operator here is
deterministic given its inputs on the task's execution profile (torch.use_deterministic_algorithms
makes an operator without a deterministic kernel on a device raise, which the dry run reports), reads
no file, socket or clock, and runs no code of the archive. Operators that draw random numbers
(dropout and its variants, attention with dropout_p, RNN dropout between layers, rand, bernoulli,
...) are allowed because the trainer seeds torch's generator for every step from the task
(ml/train/op_randomness.py), so a verifier replays them bit for bit; their randomness is switched
off while the model is evaluated.

Refused: operators of any other namespace (custom operators: their code is not in the archive and
workers never run code they receive), higher-order operators (control flow, autocast regions),
operators that read uninitialised memory, and anything not listed. `refusal` turns each refused
operator into a sentence naming it, the module it came from and what to change.
"""
from __future__ import annotations

_FAMILIES = {
    "shape": """
        alias broadcast_to cat chunk clone column_stack contiguous detach detach_ diagonal
        dsplit expand expand_as flatten flip fliplr flipud gather hsplit hstack index index_add index_copy
        index_fill index_put index_put_ index_select lift_fresh_copy masked_scatter movedim moveaxis narrow
        narrow_copy pad constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d
        replication_pad1d replication_pad2d replication_pad3d _pad_circular permute repeat
        repeat_interleave reshape roll rot90 scatter scatter_add scatter_reduce select select_scatter slice
        slice_scatter split split_with_sizes squeeze stack swapaxes swapdims t take_along_dim tensor_split
        tile transpose unbind unflatten unfold unsqueeze view view_as vsplit vstack _unsafe_view
        im2col col2im channel_shuffle pixel_shuffle pixel_unshuffle diag_embed
    """,
    "creation": """
        arange eye full full_like linspace logspace new_full new_ones new_zeros ones ones_like scalar_tensor
        tril triu tril_indices triu_indices zeros zeros_like fill fill_ zero_ copy copy_ _to_copy to type_as
        _assert_tensor_metadata _assert_scalar sym_size sym_numel sym_stride sym_storage_offset
        item _local_scalar_dense one_hot
    """,
    "elementwise": """
        abs acos acosh add addcdiv addcmul asin asinh atan atan2 atanh bitwise_and bitwise_not bitwise_or
        bitwise_xor ceil clamp clamp_max clamp_min clip copysign cos cosh deg2rad div eq erf erfc erfinv exp
        exp2 expm1 floor floor_divide fmod frac ge gt hypot isfinite isinf isnan le lerp log log10 log1p log2
        logaddexp logical_and logical_not logical_or logical_xor logit lt masked_fill maximum minimum mul
        nan_to_num ne neg pow rad2deg reciprocal remainder round rsqrt sigmoid sign sin sinh sqrt square sub
        tan tanh trunc where xlogy true_divide
    """,
    "reduction": """
        all amax amin aminmax any argmax argmin argsort cummax cummin cumprod cumsum logcumsumexp logsumexp
        max mean min nansum norm linalg_vector_norm frobenius_norm prod sort std std_mean sum topk var
        var_mean
    """,
    "linear": """
        addbmm addmm addmv baddbmm bilinear _trilinear bmm dot einsum linear matmul mm mv outer tensordot
    """,
    "convolution": """
        conv1d conv2d conv3d convolution _convolution conv_transpose1d conv_transpose2d conv_transpose3d
    """,
    "pooling": """
        adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d
        adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d avg_pool1d avg_pool2d avg_pool3d
        max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices
        max_pool3d_with_indices max_unpool2d max_unpool3d upsample_nearest1d upsample_nearest2d
        upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d _upsample_nearest_exact3d
        upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d
        _upsample_bilinear2d_aa _upsample_bicubic2d_aa grid_sampler grid_sampler_2d grid_sampler_3d
        affine_grid_generator
    """,
    "normalisation": """
        batch_norm native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_functional
        _native_batch_norm_legit_no_training layer_norm native_layer_norm group_norm native_group_norm
        instance_norm rms_norm _fused_rms_norm _weight_norm _weight_norm_interface renorm
        local_response_norm
    """,
    "activation": """
        celu elu gelu glu hardshrink hardsigmoid hardswish hardtanh leaky_relu log_sigmoid
        log_sigmoid_forward mish prelu _prelu_kernel relu relu6 selu silu softplus softshrink threshold
        softmax log_softmax _softmax _log_softmax
    """,
    "attention": """
        scaled_dot_product_attention _scaled_dot_product_attention_math
        _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention
        _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
    """,
    "recurrent": """
        gru lstm rnn_tanh rnn_relu gru_cell lstm_cell rnn_tanh_cell rnn_relu_cell
    """,
    "embedding": """
        embedding embedding_bag _embedding_bag _embedding_bag_forward_only embedding_renorm
    """,
    "loss": """
        mse_loss l1_loss smooth_l1_loss huber_loss cross_entropy_loss nll_loss nll_loss_nd nll_loss2d
        nll_loss_forward binary_cross_entropy binary_cross_entropy_with_logits kl_div cosine_similarity
        pairwise_distance cdist _euclidean_dist cosine_embedding_loss margin_ranking_loss
        soft_margin_loss multilabel_margin_loss hinge_embedding_loss triplet_margin_loss
    """,
    # random: seeded per step from the task (ml/train/op_randomness.py); off while evaluating
    "random": """
        dropout native_dropout feature_dropout alpha_dropout feature_alpha_dropout bernoulli rand
        rand_like randn randn_like randint randint_like randperm normal uniform exponential multinomial
        rrelu rrelu_with_noise
    """,
}
# families whose operators also come in in-place form (`relu_`, `masked_fill_`, `dropout_`, ...)
_IN_PLACE_FAMILIES = ("elementwise", "activation", "random", "normalisation", "embedding")

ALLOWED_BY_FAMILY: dict[str, frozenset[str]] = {
    family: frozenset(names.split()) | (frozenset(f"{n}_" for n in names.split()) if family in _IN_PLACE_FAMILIES
                                        else frozenset())
    for family, names in _FAMILIES.items()
}
ALLOWED_ATEN_OPS: frozenset[str] = frozenset().union(*ALLOWED_BY_FAMILY.values())
RANDOM_ATEN_OPS: frozenset[str] = ALLOWED_BY_FAMILY["random"] | frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "gru", "lstm", "rnn_tanh", "rnn_relu"})

# Python-level calls export writes for symbolic sizes (`batch * 64`, `max(a, b)`, ...)
ALLOWED_PYTHON_OPS = frozenset({
    "_operator.getitem", "_operator.add", "_operator.sub", "_operator.mul", "_operator.floordiv", "_operator.mod",
    "_operator.neg", "_operator.truediv", "_operator.pow", "_operator.eq", "_operator.ne", "_operator.lt",
    "_operator.le", "_operator.gt", "_operator.ge", "_operator.and_", "_operator.or_", "_operator.not_",
    "math.ceil", "math.floor", "math.sqrt", "torch.sym_float", "torch.sym_int", "torch.sym_max", "torch.sym_min",
    "torch.sym_not", "torch.sym_ite", "torch.sym_sqrt", "torch.sym_sum",
})

# aten operators refused on purpose, with what to change
_REFUSED_ATEN = {
    "empty": "it returns uninitialised memory (not reproducible); use torch.zeros",
    "empty_like": "it returns uninitialised memory (not reproducible); use torch.zeros_like",
    "new_empty": "it returns uninitialised memory (not reproducible); use Tensor.new_zeros",
    "empty_strided": "it returns uninitialised memory (not reproducible); use torch.zeros",
    "as_strided": "raw strided views are refused; use view/reshape/unfold",
    "set_": "it swaps a tensor's storage; use copy_ or a new tensor",
    "resize_": "it reallocates a tensor in place; build a tensor of the size you need",
    "to_sparse": "sparse tensors are not supported; keep the model dense",
    "_to_dense": "sparse tensors are not supported; keep the model dense",
}
_NAMESPACE_ADVICE = {
    "higher_order": "control flow (torch.cond, while_loop, map), torch.no_grad/autocast regions and other "
                    "higher-order operators are not supported: remove them from forward (export in float32, "
                    "with no autocast or no_grad inside the model)",
    "quantized_decomposed": "quantized models are not supported: export the float model",
    "quantized": "quantized models are not supported: export the float model",
    "prims": "export the model with torch.export.export (no run_decompositions to prims)",
}


def op_name(target: str) -> str:
    """"torch.ops.aten.linear.default" -> "aten.linear"; "_operator.getitem" unchanged."""
    if target.startswith("torch.ops."):
        return target[len("torch.ops."):].rsplit(".", 1)[0]
    return target


def op_allowed(name: str) -> bool:
    namespace, _, op = name.partition(".")
    return (namespace == "aten" and op in ALLOWED_ATEN_OPS) or name in ALLOWED_PYTHON_OPS


def advice(name: str) -> str:
    """What to change about refused operator `name` ("aten.empty", "mylib.fused", ...)."""
    namespace, _, op = name.partition(".")
    if namespace == "aten":
        if op in _REFUSED_ATEN:
            return _REFUSED_ATEN[op]
        return ("it is not on the allow-list (ml/train/op_policy.py): write that step with allow-listed "
                "torch operations, or propose the operator if it is deterministic")
    if namespace in _NAMESPACE_ADVICE:
        return _NAMESPACE_ADVICE[namespace]
    if name.startswith(("call_module", "call_method")):
        return "the graph calls a module or method: export with torch.export.export, which inlines them"
    return ("a custom or Python operator: workers run only torch's own (aten) operators, never code that "
            "comes with a task; write it with torch operations before exporting")


def module_of_stack(stack: str | dict | None) -> str:
    """'encoder.layers.0.self_attn (MultiheadAttention)' from a node's nn_module_stack, either as
    torch.export serializes it ("key,path,type;...": the innermost entry last) or as a graph node's
    meta holds it ({key: (path, type)}); "" when unknown or the model itself."""
    entries: list[tuple[str, str]] = []
    if isinstance(stack, str):
        for entry in stack.split(";"):
            parts = entry.split(",")
            if len(parts) >= 3:
                entries.append((",".join(parts[1:-1]), parts[-1]))
    elif isinstance(stack, dict):
        for value in stack.values():
            if isinstance(value, tuple) and len(value) == 2:
                path, kind = value
                entries.append((str(path), kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))))
    for path, kind in reversed(entries):
        path = path.replace("L['self'].", "").replace("L__self__.", "")
        if path and path not in ("L['self']", "L__self__"):
            return f"{path[:120]} ({kind.rsplit('.', 1)[-1][:60]})"
    return ""


def refusal(bad: dict[str, str]) -> str:
    """The refusal message for {operator: module it came from ("" when unknown)}."""
    lines = []
    for name, where in bad.items():
        place = f" in module {where}" if where else ""
        lines.append(f"{name}{place}: {advice(name)}")
    return "unsupported operator(s) in the model graph: " + "; ".join(lines)
