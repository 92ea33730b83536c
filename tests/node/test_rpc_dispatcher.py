"""JSON-RPC 2.0 dispatcher: every error code, batches, notifications, param checks, junk bodies."""
import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.rpc.dispatcher import Dispatcher
from node.rpc.errors import RpcError, TransactionRejected


def make_dispatcher(**kwargs) -> Dispatcher:
    rpc = Dispatcher(**kwargs)

    @rpc.method("dkb_add")
    async def add(a: int, b: int = 0) -> int:
        return a + b

    @rpc.method("dkb_echo")
    async def echo(value: str | None, tags: list[str] | None = None, opts: dict | None = None) -> list:
        return [value, tags, opts]

    @rpc.method("dkb_boom")
    async def boom() -> None:
        raise RuntimeError("secret internal detail /etc/passwd")

    @rpc.method("dkb_reject")
    async def reject() -> None:
        raise TransactionRejected("nonce too low", data={"expected": 7})

    @rpc.method("dkb_notJson")
    async def not_json() -> object:
        return {"x": object()}

    @rpc.method("dkb_nan")
    async def nan() -> float:
        return float("nan")

    return rpc


RPC = make_dispatcher()


def call(body, rpc=RPC):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = asyncio.run(rpc.handle(raw))
    return None if answer is None else json.loads(answer)


def req(method, params=None, id=1):
    doc = {"jsonrpc": "2.0", "method": method, "id": id}
    if params is not None:
        doc["params"] = params
    return doc


def test_positional_and_named_params():
    assert call(req("dkb_add", [2, 3])) == {"jsonrpc": "2.0", "id": 1, "result": 5}
    assert call(req("dkb_add", {"a": 2}, id="x"))["result"] == 2
    assert call(req("dkb_echo", [None, ["a"]]))["result"] == [None, ["a"], None]


@pytest.mark.parametrize(
    "params, fragment",
    [
        ([], "missing a required argument: 'a'"),
        ([1, 2, 3], "too many positional arguments"),
        ({"a": 1, "c": 2}, "unexpected keyword argument 'c'"),
        (["1"], "'a' must be an integer, got a string"),
        ([True], "'a' must be an integer, got a boolean"),
        ([1.5], "'a' must be an integer, got a number"),
    ],
)
def test_invalid_params(params, fragment):
    answer = call(req("dkb_add", params))
    assert answer["error"]["code"] == -32602 and fragment in answer["error"]["message"]
    assert answer["id"] == 1


def test_invalid_params_on_generic_and_optional_hints():
    assert call(req("dkb_echo", [5]))["error"]["code"] == -32602
    assert call(req("dkb_echo", ["v", ["a", 1]]))["error"]["code"] == -32602
    assert call(req("dkb_echo", ["v", None, []]))["error"]["code"] == -32602


def test_parse_error():
    for body in (b"{", b"\xff\xfe", b"NaN", b'{"a": Infinity}', b"[" * 100_000, b"1e999", b""):
        answer = call(body)
        assert answer["error"]["code"] == -32700 and answer["id"] is None, body[:10]


@pytest.mark.parametrize(
    "doc",
    [
        5, "x", None, {"method": "dkb_add", "id": 1}, {"jsonrpc": "1.0", "method": "dkb_add", "id": 1},
        {"jsonrpc": "2.0", "method": 5, "id": 1}, {"jsonrpc": "2.0", "method": "dkb_add", "params": 3, "id": 1},
        {"jsonrpc": "2.0", "method": "dkb_add", "id": {"a": 1}}, {"jsonrpc": "2.0", "method": "dkb_add", "id": True},
        [],
    ],
)
def test_invalid_request(doc):
    answer = call(doc)
    assert answer["error"]["code"] == -32600


def test_invalid_request_keeps_a_valid_id():
    assert call({"jsonrpc": "1.0", "method": "dkb_add", "id": 9})["id"] == 9


def test_method_not_found_and_reserved_names():
    assert call(req("dkb_nope"))["error"]["code"] == -32601
    assert call(req("rpc.discover"))["error"]["code"] == -32601


def test_internal_error_never_leaks_details(caplog):
    answer = call(req("dkb_boom"))
    assert answer["error"] == {"code": -32603, "message": "Internal error"}
    assert "secret" not in json.dumps(answer)
    assert "secret internal detail" in caplog.text  # logged for the operator
    assert call(req("dkb_notJson"))["error"]["code"] == -32603
    assert call(req("dkb_nan"))["error"]["code"] == -32603


def test_server_error_with_data():
    assert call(req("dkb_reject"))["error"] == {"code": -32003, "message": "nonce too low", "data": {"expected": 7}}
    assert RpcError("x", code=-32005).to_json() == {"code": -32005, "message": "x"}


def test_notifications_get_no_response():
    assert call({"jsonrpc": "2.0", "method": "dkb_add", "params": [1]}) is None
    assert call({"jsonrpc": "2.0", "method": "dkb_nope"}) is None
    assert call({"jsonrpc": "2.0", "method": "dkb_boom"}) is None


def test_batch_mixes_results_errors_and_notifications():
    batch = [
        req("dkb_add", [1, 2], id=1),
        {"jsonrpc": "2.0", "method": "dkb_add", "params": [1]},
        req("dkb_nope", id=2),
        7,
        req("dkb_add", ["x"], id=3),
    ]
    answers = call(batch)
    assert len(answers) == 4
    by_id = {a["id"]: a for a in answers if a["id"] is not None}
    assert by_id[1]["result"] == 3
    assert by_id[2]["error"]["code"] == -32601
    assert by_id[3]["error"]["code"] == -32602
    assert [a["error"]["code"] for a in answers if a["id"] is None] == [-32600]
    assert call([{"jsonrpc": "2.0", "method": "dkb_add", "params": [1]}]) is None


def test_batch_runs_concurrently():
    rpc = Dispatcher()
    gate = asyncio.Event()

    @rpc.method("dkb_wait")
    async def wait() -> str:
        await gate.wait()
        return "done"

    @rpc.method("dkb_open")
    async def open_gate() -> str:
        gate.set()
        return "opened"

    answers = call([req("dkb_wait", id=1), req("dkb_open", id=2)], rpc)
    assert sorted(a["result"] for a in answers) == ["done", "opened"]


def test_limits():
    rpc = make_dispatcher(max_body_bytes=100, max_batch=2)
    big = call(req("dkb_echo", ["x" * 200]), rpc)
    assert big["error"]["code"] == -32600 and "exceeds the limit" in big["error"]["message"]
    batch = call([req("dkb_add", [1], id=i) for i in range(3)], make_dispatcher(max_batch=2))
    assert batch["error"]["code"] == -32600 and "batch of 3" in batch["error"]["message"]


def test_registration_rules():
    rpc = Dispatcher()

    async def fine() -> int:
        return 1

    with pytest.raises(ValueError, match="must start with 'dkb_'"):
        rpc.register("eth_call", fine)
    with pytest.raises(TypeError, match="async"):
        rpc.register("dkb_sync", lambda: 1)
    rpc.register("dkb_fine", fine)
    with pytest.raises(ValueError, match="already registered"):
        rpc.register("dkb_fine", fine)


def test_child_dispatcher_overrides_and_falls_back():
    parent = make_dispatcher()
    child = parent.child()

    @child.method("dkb_only")
    async def only() -> str:
        return "child"

    assert call(req("dkb_add", [1, 1]), child)["result"] == 2
    assert call(req("dkb_only"), child)["result"] == "child"
    assert call(req("dkb_only"), parent)["error"]["code"] == -32601


def _assert_valid_error_or_result(answer_bytes):
    if answer_bytes is None:
        return
    answer = json.loads(answer_bytes)
    items = answer if isinstance(answer, list) else [answer]
    for item in items:
        assert item["jsonrpc"] == "2.0" and "id" in item
        assert ("result" in item) != ("error" in item)
        if "error" in item:
            assert isinstance(item["error"]["code"], int) and isinstance(item["error"]["message"], str)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_always_get_a_valid_json_rpc_error(body):
    answer = asyncio.run(RPC.handle(body))
    _assert_valid_error_or_result(answer)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "method": st.sampled_from(["dkb_add", "dkb_echo", "dkb_boom", "dkb_reject", "nope"]) | json_values,
        "params": json_values,
        "id": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(request_like, st.lists(request_like | json_values, max_size=5), json_values))
def test_random_json_documents_never_crash(doc):
    answer = asyncio.run(RPC.handle(json.dumps(doc).encode()))
    _assert_valid_error_or_result(answer)
