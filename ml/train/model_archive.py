"""Loading a task's model from a torch.export archive (.pt2) without running code it carries.

`torch.export.load` (torch 2.13) is not safe on untrusted files (docs/adr/0148): it unpickles
(`torch.load(weights_only=False)`) weights or constants flagged `use_pickle`, legacy `.pt` weight
files, opaque constants (`pickle.loads`) and, as a fallback, sample inputs; it loads AOTInductor
shared libraries; it `sympy.sympify`s (Python `eval`) the shape expressions of the graph JSON; it
writes serialized node and argument names verbatim into the Python source that `ep.module()`
compiles; and it resolves any `torch.*` attribute as a call target. So this module reads the archive
itself: it checks the archive's file list, the JSON of the graph (names are identifiers, shape
expressions are made of a few known tokens, every call target is on the allow-list of
ml/train/op_policy.py) and the weight
configs (raw tensors only), then deserializes with torch's own code, never loading the sample inputs
(the one part stored as a pickle) and never unpickling anything.
"""
from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import torch

from ml.train.op_policy import module_of_stack, op_allowed, op_name, refusal
from ml.train.op_randomness import switchable_randomness

MODEL_NAME = "model"
MAX_JSON_BYTES = 64 << 20   # the graph and config JSON files, uncompressed
PICKLE_MAGIC = (b"\x80",)  # a pickle stream (protocol 2+) opens with PROTO

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FQN = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*\Z")
_SYMBOL = re.compile(r"[a-z]+[0-9]+\Z")
_EXPR_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+(?:\.[0-9]+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                         r"|'(?P<sym>[a-z]+[0-9]+)'|(?P<punct>\*\*|[-+*/(),=%]))")
_EXPR_NAMES = frozenset("""
    Symbol Integer Rational True False positive integer real nonnegative finite oo Max Min Abs floor
    ceiling sqrt FloorDiv ModularIndexing Where PythonMod Mod CleanDiv CeilToInt FloorToInt CeilDiv
    LShift RShift PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator
    TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat Identity Mul Add Pow Eq Ne Lt Le Gt Ge
    StrictLessThan LessThan StrictGreaterThan GreaterThan And Or Not
""".split())
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


def _archive_members(path: Path) -> tuple[str, dict[str, str]]:
    """(prefix, {name without prefix: name}) of the archive's files, each checked against the layout."""
    with zipfile.ZipFile(path) as archive:
        infos = [info for info in archive.infolist() if not info.is_dir()]
    names = [info.filename for info in infos]
    for info in infos:
        if info.filename.endswith(".json") and info.file_size > MAX_JSON_BYTES:
            raise ArchiveRefused(f"{path.name}: {info.filename} unpacks to {info.file_size} bytes, over the limit "
                                 f"of {MAX_JSON_BYTES}")
    if any(name.endswith("data.pkl") for name in names):
        raise ArchiveRefused(f"{path.name} is a torch.save checkpoint (pickle), not a torch.export archive; "
                             "export the model with torch.export.export and torch.export.save")
    prefixes = {name.split("/", 1)[0] for name in names}
    if len(prefixes) != 1 or not all("/" in name for name in names):
        raise ArchiveRefused(f"{path.name}: not a torch.export archive (expected one top folder)")
    prefix = prefixes.pop()
    members = {name.split("/", 1)[1]: name for name in names}
    for name in members:
        if name.startswith("data/aotinductor/"):
            raise ArchiveRefused(f"{path.name} holds AOTInductor native code ({name}); only exported graphs "
                                 "are accepted")
        if not _ALLOWED_FILES.match(name):
            raise ArchiveRefused(f"{path.name}: unexpected file {name!r} in the archive (legacy or pickled "
                                 "contents are not accepted)")
    for needed in ("archive_format", "models/model.json", "data/weights/model_weights_config.json",
                   "data/constants/model_constants_config.json"):
        if needed not in members:
            raise ArchiveRefused(f"{path.name}: {needed} missing: not a torch.export archive saved by "
                                 f"torch {torch.__version__}")
    return prefix, members


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


def check_expression(expr: str) -> None:
    """Refuse a shape expression that is more than symbols, numbers, arithmetic and known functions
    (torch parses these with sympy.sympify, that is Python eval)."""
    pos = 0
    while pos < len(expr):
        match = _EXPR_TOKEN.match(expr, pos)
        if not match or match.end() == pos:
            raise ArchiveRefused(f"shape expression {expr[:80]!r} refused at offset {pos}")
        name = match.group("name")
        if name is not None and name not in _EXPR_NAMES and not _SYMBOL.match(name):
            raise ArchiveRefused(f"shape expression {expr[:80]!r}: {name!r} is not allowed")
        pos = match.end()


def check_graph_json(graph: dict) -> None:
    """Every name is an identifier, every call target on the allow-list (a refusal names the operator,
    the module it came from and what to change), every expression plain."""
    bad: dict[str, str] = {}

    def walk(value, key: str) -> None:
        if isinstance(value, dict):
            target = value.get("target")
            if isinstance(target, str):
                name = op_name(target)
                if not op_allowed(name) and name not in bad:
                    metadata = value.get("metadata")
                    stack = metadata.get("nn_module_stack") if isinstance(metadata, dict) else None
                    bad[name] = module_of_stack(stack if isinstance(stack, str) else None)
            for k, v in value.items():
                if key == "tensor_values" or key == "sym_int_values" or key == "range_constraints":
                    if not isinstance(k, str) or not _IDENTIFIER.match(k):
                        raise ArchiveRefused(f"bad value name {str(k)[:80]!r} in the graph")
                walk(v, k)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)
        elif isinstance(value, str):
            if key in ("name", "arg_name") and not _IDENTIFIER.match(value):
                raise ArchiveRefused(f"bad name {value[:80]!r} in the graph")
            elif key == "expr_str":
                check_expression(value)
            elif key in ("parameter_name", "buffer_name", "tensor_constant_name", "fqn") and value \
                    and not _FQN.match(value):
                raise ArchiveRefused(f"bad attribute path {value[:80]!r} in the graph")

    walk(graph, "")
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


def load_archive(path: Path | str) -> torch.export.ExportedProgram:
    """The ExportedProgram in the .pt2 file at `path`, loaded without unpickling or eval of its contents.

    Raises ArchiveRefused naming the reason (a pickle, native code, an unsupported operator, ...).
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass
    from torch.export.pt2_archive._package import PT2ArchiveReader, _load_constants, _load_state_dict

    path = Path(path)
    _refuse_non_archive(path)
    prefix, members = _archive_members(path)
    with zipfile.ZipFile(path) as archive:
        if archive.read(members["archive_format"]).strip() != b"pt2":
            raise ArchiveRefused(f"{path.name}: not a pt2 archive")
        try:
            graph_bytes = archive.read(members["models/model.json"])
            graph = json.loads(graph_bytes)
            for what, name in (("weight", "data/weights/model_weights_config.json"),
                               ("constant", "data/constants/model_constants_config.json")):
                _check_payload_config(json.loads(archive.read(members[name])), what)
        except (ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, ArchiveRefused):
                raise
            raise ArchiveRefused(f"{path.name}: malformed archive JSON ({exc})") from None
    if not isinstance(graph, dict):
        raise ArchiveRefused(f"{path.name}: malformed model JSON")
    check_graph_json(graph)
    try:
        with PT2ArchiveReader(str(path)) as reader:
            serialized = _bytes_to_dataclass(schema.ExportedProgram, graph_bytes)
            state_dict = _load_state_dict(reader, MODEL_NAME)
            constants = _load_constants(reader, MODEL_NAME)
        program = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)
    except ArchiveRefused:
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
