"""Loading a task's model from a torch.export archive (.pt2) without running code it carries.

`torch.export.load` (torch 2.13) is not safe on untrusted files (docs/adr/0148): it unpickles
(`torch.load(weights_only=False)`) weights or constants flagged `use_pickle`, legacy `.pt` weight
files, opaque constants (`pickle.loads`) and, as a fallback, sample inputs; it loads AOTInductor
shared libraries; it `sympy.sympify`s (Python `eval`) the shape expressions of the graph JSON; it
writes serialized node and argument names verbatim into the Python source that `ep.module()`
compiles; and it resolves any `torch.*` attribute as a call target. So this module reads the archive
itself: it checks the archive's file list, the JSON of the graph (names are identifiers, shape
expressions are bounded sympy srepr, every call target is on the allow-list of ml/train/op_policy.py)
and the weight configs (raw tensors only), then deserializes with torch's own code, never loading the sample inputs
(the one part stored as a pickle) and never unpickling anything.

Bounded work (docs/adr/0184): shape expressions are parsed by ml/train/shape_expr.py before torch
sympifies them; every member's declared size is checked before it is inflated (small fixed files,
JSON caps, weight files against the bytes their own tensor metadata needs, a ratio cap) and read with
a bounded reader; the weight tensors are built here from those reads, so torch never opens the zip.
"""
from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import torch

from ml.train.bounded_zip import ZipBoundError, checked_members, read_member
from ml.train.op_policy import module_of_stack, op_allowed, op_name, refusal
from ml.train.op_randomness import switchable_randomness
from ml.train.shape_expr import ShapeExprError, parse

MODEL_NAME = "model"
MAX_JSON_BYTES = 64 << 20          # the graph JSON, uncompressed
MAX_CONFIG_JSON_BYTES = 16 << 20   # each weight / constant config JSON
MAX_WEIGHT_BYTES = 4 << 30         # the weight and constant tensors the configs describe, in all
MAX_UNREAD_BYTES = 1 << 30         # files never read (sample inputs, extra/*), each
MAX_UNPACKED_BYTES = 2 * MAX_WEIGHT_BYTES + MAX_JSON_BYTES + 2 * MAX_CONFIG_JSON_BYTES + (2 << 30)
MAX_INT = 1 << 63                  # any integer in the graph JSON (torch sizes are int64)
MAX_DIMS = 32
SMALL_FILES = {"archive_format": 16, "archive_version": 16, "byteorder": 16, ".data/version": 16,
               ".data/serialization_id": 128}
PICKLE_MAGIC = (b"\x80",)  # a pickle stream (protocol 2+) opens with PROTO

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FQN = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*\Z")
_ALLOWED_FILES = re.compile(r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
                            r"|models/model\.json|data/sample_inputs/model\.pt"
                            r"|data/(weights|constants)/(model_(weights|constants)_config\.json"
                            r"|(weight|tensor_constant|tensor)_?[0-9]+)|extra/[^/]+)\Z")


class ArchiveRefused(ValueError):
    """A model file that is not a safe torch.export archive (the message says why)."""


def _refuse_non_archive(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:1] in PICKLE_MAGIC:
        raise ArchiveRefused(f"{path.name} is a pickle, not a torch.export archive; workers never unpickle. "
                             "Export the model: torch.export.save(torch.export.export(model, example), 'm.pt2')")
    if not zipfile.is_zipfile(path):
        raise ArchiveRefused(f"{path.name} is not a torch.export archive (.pt2 zip file)")


def _archive_members(path: Path, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """{name without the top folder: info} of the archive's files, each checked against the layout and
    its declared size against the static limits (the weight files are checked in _payload_files)."""
    try:
        infos = checked_members(archive, path.name, MAX_UNPACKED_BYTES)
    except ZipBoundError as exc:
        raise ArchiveRefused(str(exc)) from None
    names = list(infos)
    if any(name.endswith("data.pkl") for name in names):
        raise ArchiveRefused(f"{path.name} is a torch.save checkpoint (pickle), not a torch.export archive; "
                             "export the model with torch.export.export and torch.export.save")
    prefixes = {name.split("/", 1)[0] for name in names}
    if len(prefixes) != 1 or not all("/" in name for name in names):
        raise ArchiveRefused(f"{path.name}: not a torch.export archive (expected one top folder)")
    members = {name.split("/", 1)[1]: info for name, info in infos.items()}
    for name, info in members.items():
        if name.startswith("data/aotinductor/"):
            raise ArchiveRefused(f"{path.name} holds AOTInductor native code ({name}); only exported graphs "
                                 "are accepted")
        if not _ALLOWED_FILES.match(name):
            raise ArchiveRefused(f"{path.name}: unexpected file {name!r} in the archive (legacy or pickled "
                                 "contents are not accepted)")
        limit = _static_limit(name)
        if limit is not None and info.file_size > limit:
            raise ArchiveRefused(f"{path.name}: {name} unpacks to {info.file_size} bytes, over the limit of "
                                 f"{limit}")
    for needed in ("archive_format", "models/model.json", "data/weights/model_weights_config.json",
                   "data/constants/model_constants_config.json"):
        if needed not in members:
            raise ArchiveRefused(f"{path.name}: {needed} missing: not a torch.export archive saved by "
                                 f"torch {torch.__version__}")
    return members


def _static_limit(name: str) -> int | None:
    """The most bytes the member `name` may unpack to; None for a weight or constant file (its limit
    comes from its tensors' metadata)."""
    if name in SMALL_FILES:
        return SMALL_FILES[name]
    if name == "models/model.json":
        return MAX_JSON_BYTES
    if name.endswith("_config.json"):
        return MAX_CONFIG_JSON_BYTES
    if name.startswith("data/weights/") or name.startswith("data/constants/"):
        return None
    return MAX_UNREAD_BYTES   # sample inputs and extra files: never read, bounded all the same


def _read(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytearray:
    try:
        return read_member(archive, info, limit, path.name)
    except ZipBoundError as exc:
        raise ArchiveRefused(str(exc)) from None


def _check_payload_config(config: dict, what: str) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ArchiveRefused(f"malformed {what} config")
    for fqn, meta in entries.items():
        if not isinstance(fqn, str) or not _FQN.match(fqn):
            raise ArchiveRefused(f"bad {what} name {fqn!r}")
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False or not meta.get("tensor_meta"):
            raise ArchiveRefused(f"{what} {fqn!r} is stored as a pickle or custom object; only plain tensors "
                                 "are accepted")
        if not re.fullmatch(r"(weight|tensor_constant|tensor)_?[0-9]+", str(meta.get("path_name", ""))):
            raise ArchiveRefused(f"{what} {fqn!r}: bad payload name {meta.get('path_name')!r}")


def _as_int(value, what: str, low: int = 0, high: int = MAX_INT) -> int:
    number = value.get("as_int") if isinstance(value, dict) else None
    if type(number) is not int or not low <= number < high:
        raise ArchiveRefused(f"{what}: expected a constant integer in [{low}, {high}), got {str(value)[:80]}")
    return number


def tensor_layout(fqn: str, meta: dict) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int, int]:
    """(dtype, sizes, strides, storage offset, bytes of storage they reach) of a payload's tensor_meta,
    refused unless it is a plain strided tensor of constant shape."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    tensor_meta = meta["tensor_meta"]
    if not isinstance(tensor_meta, dict) or tensor_meta.get("layout") != schema.Layout.Strided:
        raise ArchiveRefused(f"{fqn!r}: only strided tensors are accepted")
    dtype = _SERIALIZE_TO_TORCH_DTYPE.get(tensor_meta.get("dtype"))
    sizes, strides = tensor_meta.get("sizes"), tensor_meta.get("strides")
    if dtype is None or not isinstance(sizes, list) or not isinstance(strides, list) \
            or len(sizes) != len(strides) or len(sizes) > MAX_DIMS:
        raise ArchiveRefused(f"{fqn!r}: malformed tensor metadata")
    shape = tuple(_as_int(v, f"{fqn!r} size", high=1 << 40) for v in sizes)
    stride = tuple(_as_int(v, f"{fqn!r} stride", high=1 << 40) for v in strides)
    offset = _as_int(tensor_meta.get("storage_offset"), f"{fqn!r} storage offset", high=1 << 40)
    span = 0 if 0 in shape else offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    return dtype, shape, stride, offset, span * dtype.itemsize


def _payload_files(path: Path, config: dict, folder: str, members: dict[str, zipfile.ZipInfo]) -> dict[str, int]:
    """{payload file: bytes its tensors reach} for one config; each file's declared size is checked
    against what its tensors need (a file padded past twice that, plus 4 KiB, is refused)."""
    needed: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for fqn, meta in config["config"].items():
        dtype, _, _, _, reach = tensor_layout(fqn, meta)
        name = f"{folder}/{meta['path_name']}"
        info = members.get(name)
        if info is None:
            raise ArchiveRefused(f"{path.name}: {name} (the data of {fqn!r}) is missing")
        if info.file_size % dtype.itemsize:
            raise ArchiveRefused(f"{path.name}: {name} holds {info.file_size} bytes, not a whole number of "
                                 f"{dtype} elements")
        needed[name] = max(needed.get(name, 0), reach)
        sizes[name] = info.file_size
    for name, reach in needed.items():
        declared = sizes[name]
        if declared and (declared < reach or declared > 2 * reach + 4096):
            raise ArchiveRefused(f"{path.name}: {name} holds {declared} bytes for tensors that reach {reach}"
                                 + (" (padded: save plain tensors, e.g. .clone() a view)" if declared > reach
                                    else ""))
    return {name: max(reach, sizes[name]) for name, reach in needed.items()}


def check_expression(expr: str, where: str = "") -> None:
    """Refuse a shape expression that is not the srepr of bounded sympy arithmetic on torch's symbols
    (torch reads it with sympy.sympify, that is Python eval; ml/train/shape_expr.py, docs/adr/0184)."""
    try:
        parse(expr)
    except ShapeExprError as exc:
        raise ArchiveRefused(f"{exc}{f' (in {where})' if where else ''}") from None


def check_graph_json(graph: dict) -> None:
    """Every name is an identifier, every call target on the allow-list (a refusal names the operator,
    the module it came from and what to change), every expression plain and bounded, every integer
    within int64."""
    bad: dict[str, str] = {}
    named = ("tensor_values", "sym_int_values", "sym_float_values", "sym_bool_values", "range_constraints")

    def walk(value, key: str, where: str) -> None:
        if isinstance(value, dict):
            target = value.get("target")
            if isinstance(target, str):
                name = op_name(target)
                if not op_allowed(name) and name not in bad:
                    metadata = value.get("metadata")
                    stack = metadata.get("nn_module_stack") if isinstance(metadata, dict) else None
                    bad[name] = module_of_stack(stack if isinstance(stack, str) else None)
            for k, v in value.items():
                if key in named:
                    if not isinstance(k, str) or not _IDENTIFIER.match(k):
                        raise ArchiveRefused(f"bad value name {str(k)[:80]!r} in the graph")
                    walk(v, k, f"{key}[{k!r}]")
                else:
                    walk(v, k, where)
        elif isinstance(value, list):
            for item in value:
                walk(item, key, where)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int):
            if not -MAX_INT <= value < MAX_INT:
                raise ArchiveRefused(f"integer {str(value)[:40]} in the graph ({where or key}) is outside int64")
        elif isinstance(value, str):
            if key in ("name", "arg_name") and not _IDENTIFIER.match(value):
                raise ArchiveRefused(f"bad name {value[:80]!r} in the graph")
            elif key == "expr_str":
                check_expression(value, where)
            elif key in ("parameter_name", "buffer_name", "tensor_constant_name", "fqn") and value \
                    and not _FQN.match(value):
                raise ArchiveRefused(f"bad attribute path {value[:80]!r} in the graph")

    walk(graph, "", "")
    if bad:
        raise ArchiveRefused(refusal(bad))


def check_graph_module(module: torch.nn.Module) -> None:
    """The same allow-list on a deserialized graph (defence in depth, and for in-memory programs)."""
    bad: dict[str, str] = {}
    graph = module.graph
    if not isinstance(graph, torch.fx.Graph):
        raise ArchiveRefused("the model is not a graph module")
    for node in graph.nodes:
        if node.op == "call_function":
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                name = str(target).rsplit(".", 1)[0]
            else:
                name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__name__', target)}"
            if not op_allowed(name) and name not in bad:
                bad[name] = module_of_stack(node.meta.get("nn_module_stack"))
        elif node.op in ("call_module", "call_method"):
            bad[f"{node.op} {node.target}"] = module_of_stack(node.meta.get("nn_module_stack"))
    if bad:
        raise ArchiveRefused(refusal(bad))


def _inspect(path: Path, archive: zipfile.ZipFile) -> tuple[dict, dict, dict, dict[str, int]]:
    """(members, graph JSON, {"weight"|"constant": config}, {payload file: byte budget}) of an archive
    that passes every static check; nothing larger than its budget is read."""
    members = _archive_members(path, archive)
    if bytes(_read(path, archive, members["archive_format"], SMALL_FILES["archive_format"])).strip() != b"pt2":
        raise ArchiveRefused(f"{path.name}: not a pt2 archive")
    if "byteorder" in members and bytes(_read(path, archive, members["byteorder"], SMALL_FILES["byteorder"])) \
            .strip() != sys.byteorder.encode():
        raise ArchiveRefused(f"{path.name}: weights stored in another byte order than this machine's")
    configs = {}
    try:
        graph = json.loads(_read(path, archive, members["models/model.json"], MAX_JSON_BYTES))
        for what, name in (("weight", "data/weights/model_weights_config.json"),
                           ("constant", "data/constants/model_constants_config.json")):
            configs[what] = json.loads(_read(path, archive, members[name], MAX_CONFIG_JSON_BYTES))
            _check_payload_config(configs[what], what)
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ArchiveRefused):
            raise
        raise ArchiveRefused(f"{path.name}: malformed archive JSON ({exc})") from None
    if not isinstance(graph, dict):
        raise ArchiveRefused(f"{path.name}: malformed model JSON")
    check_graph_json(graph)
    files = {**_payload_files(path, configs["weight"], "data/weights", members),
             **_payload_files(path, configs["constant"], "data/constants", members)}
    unused = [name for name in members if name.startswith(("data/weights/", "data/constants/"))
              and not name.endswith("_config.json") and name not in files]
    if unused:
        raise ArchiveRefused(f"{path.name}: {unused[0]} is not the data of any weight or constant")
    total = sum(files.values())
    if total > MAX_WEIGHT_BYTES:
        raise ArchiveRefused(f"{path.name}: its tensors take {total} bytes, over the limit of {MAX_WEIGHT_BYTES}")
    return members, graph, configs, files


def _tensors(path: Path, archive: zipfile.ZipFile, members: dict, config: dict, folder: str,
             files: dict[str, int]) -> dict[str, torch.Tensor]:
    """{fqn: tensor} of a payload config, as torch's loader builds them (views of one flat tensor per
    file, so aliasing is kept), from bounded reads."""
    flat: dict[str, torch.Tensor] = {}
    tensors: dict[str, torch.Tensor] = {}
    for fqn, meta in config["config"].items():
        dtype, shape, stride, offset, _ = tensor_layout(fqn, meta)
        name = f"{folder}/{meta['path_name']}"
        if name not in flat:
            info = members[name]
            if info.file_size:
                flat[name] = torch.frombuffer(_read(path, archive, info, files[name]), dtype=dtype)
            else:   # no bytes saved (a fake tensor): zeros, as torch's loader makes them
                flat[name] = torch.zeros(files[name] // dtype.itemsize, dtype=dtype)
        tensor = torch.as_strided(flat[name], shape, stride, offset)
        if meta.get("is_param"):
            tensor = torch.nn.Parameter(tensor, requires_grad=bool(meta["tensor_meta"].get("requires_grad")))
        tensors[fqn] = tensor
    return tensors


def archive_tensor_bytes(path: Path | str) -> int:
    """The bytes of tensors the archive at `path` holds, after its static checks (ArchiveRefused)."""
    path = Path(path)
    _refuse_non_archive(path)
    with zipfile.ZipFile(path) as archive:
        return sum(_inspect(path, archive)[3].values())


def load_archive(path: Path | str) -> torch.export.ExportedProgram:
    """The ExportedProgram in the .pt2 file at `path`, loaded without unpickling or eval of its contents.

    Raises ArchiveRefused naming the reason (a pickle, native code, an unsupported operator, a shape
    expression or a file over its bounds, ...).
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    path = Path(path)
    _refuse_non_archive(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members, graph, configs, files = _inspect(path, archive)
            state_dict = _tensors(path, archive, members, configs["weight"], "data/weights", files)
            constants = _tensors(path, archive, members, configs["constant"], "data/constants", files)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveRefused(f"{path.name}: cannot read the archive: {exc}") from None
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, graph)
        program = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)
    except (ArchiveRefused, MemoryError):
        raise
    except Exception as exc:  # torch's deserializer raises many types on malformed input
        raise ArchiveRefused(f"{path.name}: cannot deserialize the exported program: {exc}") from None
    check_graph_module(program.graph_module)
    return program


def trainable_module(program: torch.export.ExportedProgram, device: str = "cpu") -> torch.nn.Module:
    """A trainable module of `program` on `device`, with its own copy of the archive's weights; its
    random operators (dropout, ...) run with their randomness off inside
    `ml.train.op_randomness.evaluating()`."""
    if device != "cpu":
        from torch.export.passes import move_to_device_pass
        program = move_to_device_pass(program, device)
    module = program.module()
    _own_weights_keeping_ties(module)
    check_graph_module(module)
    switchable_randomness(module)
    return module


def _own_weights_keeping_ties(module: torch.nn.Module) -> None:
    """Give `module` its own copy of every parameter and buffer. Parameters the archive ties (the same
    tensor under two names, e.g. a language model's input embedding and output layer) come back from
    deserialization as separate Parameters over one storage; they become one Parameter again, so
    training keeps them tied as in the user's class."""
    shared: dict[tuple, torch.nn.Parameter] = {}
    with torch.no_grad():
        for name, param in list(module.named_parameters(remove_duplicate=False)):
            key = (param.device, param.data_ptr(), tuple(param.shape), param.stride(), param.dtype) \
                if param.numel() else (name,)
            if key not in shared:
                shared[key] = torch.nn.Parameter(param.detach().clone(), requires_grad=True)
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, leaf, shared[key])
        for buffer in list(module.buffers()):
            buffer.data = buffer.data.clone()


def input_shape(program: torch.export.ExportedProgram) -> list[int | None]:
    """The first user input's shape (None for a dynamic dimension), e.g. [None, 64]."""
    for spec in program.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            for node in program.graph.nodes:
                if node.op == "placeholder" and node.name == spec.arg.name:
                    value = node.meta.get("val")
                    if value is None:
                        return []
                    return [d if isinstance(d, int) else None for d in value.shape]
    return []
