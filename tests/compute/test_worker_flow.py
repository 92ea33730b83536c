"""The compute role's worker flow before training, with a fake ledger and fake artifact service: inputs
fetched from the task's sources and co-workers (with progress), untrainable and invalid tasks rejected
once with the reason, a CUDA task refused on a node without CUDA; the hardware record; fetch_inputs."""
import asyncio
from pathlib import Path

import pytest

from consensus.task_info import TaskInfo
from consensus.tx import HARDWARE, OptionalField
from ml.compute import membership as membership_module
from ml.compute import peer_fetch as fetch_module
from ml.compute import training as training_module
from ml.compute.membership import hardware_record
from ml.compute.task_inputs import fetch_inputs, source_peers
from ml.compute.training import READY_TIMEOUT_S, ready_timeout
from ml.train.dry_run import Untrainable
from node.artifacts.quota import StoreQuota
from node.bandwidth import BandwidthMeter
from node.identity import Identity
from node.runtime import Node
from tests.node.node_harness import local_config

ART = "ab" * 32
OWNER, W2, W3 = (Identity.generate().peer_id for _ in range(3))
SOURCE = f"/ip4/198.51.100.7/tcp/4001/p2p/{OWNER}"
COMMIT = ["00" * 32, ART, 3, 5]   # [segments_root, result, segments, height]


class FakeLedger:
    def __init__(self):
        self.sent = []
        self.nodes = {W2: {"listen_addrs": ["/ip4/127.0.0.1/tcp/4102"], "relay_addrs": []},
                      W3: {"listen_addrs": ["/ip4/127.0.0.1/tcp/4103"], "relay_addrs": []}}

    async def send(self, tx_type, payload, wait_s=None):
        self.sent.append((tx_type, payload))
        return {"height": 7}

    async def call(self, method, *params):
        assert method == "dkb_getNode"
        return self.nodes.get(params[0])

    def describe(self):
        return "fake ledger"


class FakeArtifacts:
    def __init__(self, folder: Path, size=3 << 20):
        self.folder, self.size, self.fetches = folder, size, []
        self.quota = StoreQuota(folder / "quota", 1 << 40)   # the compute role sets its task pins each tick

    def has(self, artifact):
        return (self.folder / artifact).exists()

    def pin_mirrors(self, artifacts):   # the mirrored epoch states (ml/compute/state_mirror.py)
        self.quota.set_mirror_pins(artifacts)

    def path(self, artifact):
        return self.folder / artifact

    async def fetch(self, artifact, holders, *, progress=None):
        self.fetches.append((artifact, list(holders)))
        for done in (1 << 20, self.size):
            progress(done, self.size)
        path = self.folder / artifact
        path.write_bytes(bytes(self.size))
        return path


def make_role(tmp_path):
    node = Node(local_config(), Identity.generate(), ["compute"])
    role = node.role("compute")
    role.ledger = FakeLedger()
    node.artifacts = FakeArtifacts(tmp_path)
    role.hardware = {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0}
    return role


def task_doc(role, **extra):
    workers = sorted([role.node.peer_id, W2, W3])
    return {"task_id": "11" * 32, "status": "assigned", "workers": workers, "commits": {}, "slots": [],
            "owner": OWNER, "sources": [SOURCE, "junk"], "device": "cpu",
            "spec": {"model": "digits-mlp", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce",
                     "hyperparams": {"steps": 4}}, **extra}


def on_device(device):
    return TaskInfo.from_json({"task_id": "11" * 32, "status": "assigned", "device": device})


def untrainable(spec, files, world):
    raise Untrainable("the model cannot run on the dataset's batches: shape mismatch")


def test_inputs_fetched_then_untrainable_task_rejected_once(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_module, "artifact_ids", lambda spec: [ART])
    monkeypatch.setattr(training_module, "dry_run", untrainable)
    role = make_role(tmp_path)
    task = task_doc(role)
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    [(artifact, holders)] = role.node.artifacts.fetches
    assert artifact == ART and holders == [OWNER, *sorted([W2, W3])]   # the owner's sources first, then co-workers
    assert role.node.host.peerbook.addrs(OWNER) and role.node.host.peerbook.addrs(W2)
    job = role.jobs[task["task_id"]]
    assert job["state"] == "rejected" and job["fetched_bytes"] == job["fetch_total"] == 3 << 20
    assert role.board.snapshot(task["task_id"])["reason"].startswith("Untrainable: the model cannot run")
    [(tx, payload)] = role.ledger.sent
    assert tx == "reject_task" and payload["task_id"] == bytes.fromhex(task["task_id"])
    assert payload["reason"] == job["reason"] and len(payload["reason"]) <= 500


def test_a_rejected_job_is_not_started_again(tmp_path, monkeypatch):
    monkeypatch.setattr(training_module, "dry_run", untrainable)
    role = make_role(tmp_path)
    task = task_doc(role)
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    started = []
    role.training.run_job = lambda t: started.append(t)

    async def tick():
        role.ledger.call = fake_list(task)
        await role._tick()

    asyncio.run(tick())
    assert started == []
    role.jobs.clear()                           # a restart: the ledger's rejections say we rejected
    asyncio.run(tick_with(role, {**task, "rejections": {role.node.peer_id: "Untrainable: x"}}))
    assert started == []


async def tick_with(role, task):
    role.ledger.call = fake_list(task)
    await role._tick()


def fake_list(task):
    async def call(method, *params):
        return {"dkb_listTasks": [task], "dkb_blockNumber": 10}.get(method)
    return call


def test_invalid_task_is_rejected_with_the_reason(tmp_path):
    role = make_role(tmp_path)
    task = task_doc(role)
    task["spec"]["hyperparams"] = {"no_such_field": 1}
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    [(tx, payload)] = role.ledger.sent
    assert tx == "reject_task" and "unknown hyper-parameter" in payload["reason"]
    assert role.jobs[task["task_id"]]["state"] == "rejected"


def test_cuda_task_on_a_node_without_cuda_is_rejected(tmp_path):
    role = make_role(tmp_path)
    task = task_doc(role, device="cuda")
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    [(tx, payload)] = role.ledger.sent
    assert tx == "reject_task" and "needs a CUDA device" in payload["reason"]


def test_a_worker_named_to_a_running_crew_that_cannot_train_it_stays_out_without_rejecting(tmp_path):
    role = make_role(tmp_path)
    task = task_doc(role, device="cuda")
    others = [w for w in task["workers"] if w != role.node.peer_id]
    task["workers"] = [*others, "12D3KooWLeft" + "x" * 40, role.node.peer_id]   # it took the leaver's seat
    task["spec"]["workers"] = 3
    task["epochs"] = {"current": 2, "commits": {}, "joined": {role.node.peer_id: [2, 3]}}
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    assert role.ledger.sent == []     # a joiner cannot reject the task (docs/adr/0226)
    job = role.jobs[task["task_id"]]
    assert job["state"] == "failed" and "not joining the crew" in job["error"] and "CUDA" in job["error"]


def test_device_choice(tmp_path):
    role = make_role(tmp_path)
    spec = object()
    assert role.training.device_for(on_device("cpu"), spec) == "cpu"
    assert role.training.device_for(on_device("any"), spec) == "cpu"
    role.hardware["cuda_devices"] = 1
    assert role.training.device_for(on_device("any"), spec) == "cuda"
    assert role.training.device_for(on_device("cuda"), spec) == "cuda"
    with pytest.raises(Untrainable, match="unknown device"):
        role.training.device_for(on_device("tpu"), spec)


def test_reject_that_the_ledger_refuses_leaves_a_failed_job(tmp_path, monkeypatch):
    from node.ledger import TxFailed
    monkeypatch.setattr(training_module, "dry_run", untrainable)
    role = make_role(tmp_path)

    async def refuse(tx_type, payload, wait_s=None):
        raise TxFailed("reject_task", "unknown tx type")

    async def still_assigned(method, *params):
        return {"status": "assigned"}

    role.ledger.send, role.ledger.call = refuse, still_assigned
    task = task_doc(role)
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    job = role.jobs[task["task_id"]]
    assert job["state"] == "failed" and "reject_task failed" in job["error"]


def test_reject_after_the_others_ended_the_task_is_a_rejected_job(tmp_path, monkeypatch):
    from node.ledger import TxFailed
    monkeypatch.setattr(training_module, "dry_run", untrainable)
    role = make_role(tmp_path)

    async def refuse(tx_type, payload, wait_s=None):
        raise TxFailed("reject_task", "cannot reject a task that is rejected", "bad_state")

    async def rejected(method, *params):
        return {"status": "rejected"} if method == "dkb_getTask" else None

    role.ledger.send, role.ledger.call = refuse, rejected
    task = task_doc(role, sources=[])
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    assert role.jobs[task["task_id"]]["state"] == "rejected"


def test_hardware_record_has_exactly_the_ledger_fields():
    record = hardware_record({"gpu": "NVIDIA H100 80GB HBM3" + "x" * 100, "gpu_mem_mb": 81559,
                              "gpu_tflops": 51.3, "cuda_devices": 1}, 2_000_000)
    required = {name for name, check in HARDWARE.items() if not isinstance(check, OptionalField)}
    assert set(record) == required | {"profiles"}   # the one optional field a compute node always sends
    assert record["gpu"].startswith("NVIDIA H100") and len(record["gpu"]) == 64
    assert record["gpu_mem_mb"] == 81559 and record["bandwidth_mbps"] == 10**6
    scalars = {name: v for name, v in record.items() if name != "profiles"}
    assert all(type(v) in (int, str) for v in scalars.values())        # the ledger has no floats
    assert record["profiles"] == []   # execution profiles (ADR 0166): a list of ids, none detected here
    profile = "cpu-x86-64-avx2/torch-2.13.0"
    assert hardware_record({"profiles": [profile]}, 90)["profiles"] == [profile]
    assert hardware_record({}, 90)["gpu"] == "" and hardware_record({}, 90)["bandwidth_mbps"] == 90


def test_source_peers_groups_and_skips_junk():
    other = Identity.generate().peer_id
    got = source_peers([SOURCE, "/ip4/10.0.0.1/tcp/1", "not an addr", 7, f"/ip4/10.0.0.2/tcp/2/p2p/{OWNER}",
                        f"/ip4/10.0.0.3/tcp/3/p2p/{other}"])
    assert got == {OWNER: [SOURCE, f"/ip4/10.0.0.2/tcp/2/p2p/{OWNER}"], other: [f"/ip4/10.0.0.3/tcp/3/p2p/{other}"]}
    assert source_peers("nope") == {}


def test_fetch_inputs_counts_progress_over_artifacts_and_feeds_the_meter(tmp_path):
    artifacts = FakeArtifacts(tmp_path, size=2 << 20)
    held = "cd" * 32
    (tmp_path / held).write_bytes(b"x")
    seen, meter = [], BandwidthMeter()
    files = asyncio.run(fetch_inputs(artifacts, [ART, held, "ef" * 32, ART], ["p1"], lambda d, t: seen.append((d, t)),
                                     meter))
    assert set(files) == {ART, held, "ef" * 32} and files[held] == tmp_path / held
    assert [a for a, _ in artifacts.fetches] == [ART, "ef" * 32]
    assert seen[-1] == (4 << 20, 4 << 20) and seen == sorted(seen)
    assert meter.figures()["samples"]["down"] == 2


def test_fetch_inputs_raises_what_the_service_raises(tmp_path):
    class Failing(FakeArtifacts):
        async def fetch(self, artifact, holders, *, progress=None):
            raise RuntimeError("no holder can serve it")

    with pytest.raises(RuntimeError, match="no holder"):
        asyncio.run(fetch_inputs(Failing(tmp_path), [ART], [], retry_s=0.0))


def test_fetch_inputs_retries_a_failed_fetch(tmp_path):
    class FlakyOnce(FakeArtifacts):
        failed = False

        async def fetch(self, artifact, holders, *, progress=None):
            if not self.failed:
                self.failed = True
                raise RuntimeError("still misses 1 chunks")
            return await super().fetch(artifact, holders, progress=progress)

    artifacts = FlakyOnce(tmp_path)
    assert set(asyncio.run(fetch_inputs(artifacts, [ART], ["p"], retry_s=0.0))) == {ART}
    assert artifacts.failed and len(artifacts.fetches) == 1


class FakeRecord:
    def __init__(self):
        self.contributions = []

    def contribute(self, owner, **fields):
        self.contributions.append(fields)


class FakeBandwidth:
    def __init__(self):
        self.meter, self.probing = BandwidthMeter(), False

    def start_probing(self):
        self.probing = True


def test_measured_bandwidth_replaces_the_configured_guess_and_is_republished_on_change(tmp_path, monkeypatch):
    for name, value in (("FIRST_BANDWIDTH_CHECK_S", 0.0), ("BANDWIDTH_CHECK_S", 0.01), ("REPUBLISH_MIN_S", 0.0)):
        monkeypatch.setattr(membership_module, name, value)
    role = make_role(tmp_path)
    role.ledger.record = FakeRecord()
    service = FakeBandwidth()
    role.node.services = {"bandwidth": service}
    role.registered = True
    role.membership.contribute_record(100)                       # the join: the configured guess

    async def scenario():
        follow = asyncio.create_task(role.membership.follow_bandwidth())
        await asyncio.sleep(0.05)
        published = [c["hardware"]["bandwidth_mbps"] for c in role.ledger.record.contributions]
        service.meter.record_rate("up", 90.0)          # first measurement: published even though close
        service.meter.record_rate("down", 400.0)
        await asyncio.sleep(0.05)
        for _ in range(3):
            service.meter.record_rate("up", 95.0)      # within [2/3, 3/2] of 90: not republished
        await asyncio.sleep(0.05)
        for _ in range(16):
            service.meter.record_rate("up", 20.0)      # the link got slower: republished
        await asyncio.sleep(0.05)
        follow.cancel()
        return published

    before = asyncio.run(scenario())
    assert service.probing and before == [100]
    assert [c["hardware"]["bandwidth_mbps"] for c in role.ledger.record.contributions] == [100, 90, 20]
    assert role.ledger.record.contributions[-1]["roles"] == {"compute", "verifier"}


def test_the_start_barrier_waits_longer_for_big_inputs(tmp_path):
    (tmp_path / "a").write_bytes(bytes(3 << 20))
    (tmp_path / "b").write_bytes(bytes(1 << 20))
    assert ready_timeout({}) == READY_TIMEOUT_S
    assert ready_timeout({"a": tmp_path / "a", "b": tmp_path / "b"}) == READY_TIMEOUT_S + 4


def test_replay_device_cpu_or_the_same_gpu_model_only(tmp_path):
    role = make_role(tmp_path)
    gpu = "NVIDIA H100 80GB HBM3"
    role.ledger.nodes = {W2: {"hardware": {"gpu": gpu}}, W3: {"hardware": {"gpu": gpu}}}
    cuda_task = {"device": "cuda", "commits": {W2: COMMIT, W3: COMMIT}}

    async def device(task):
        return await role.verification.replay_device(TaskInfo.from_json(task))

    assert asyncio.run(device({"device": "cpu", "commits": {W2: COMMIT}})) == "cpu"
    assert asyncio.run(device({"commits": {}})) == "cpu"
    assert asyncio.run(device(cuda_task)) is None                     # no CUDA here
    role.hardware.update(gpu=gpu, cuda_devices=1)
    assert asyncio.run(device(cuda_task)) == "cuda"
    role.ledger.nodes[W3] = {"hardware": {"gpu": "NVIDIA A100-SXM4-40GB"}}
    assert asyncio.run(device(cuda_task)) is None                     # another GPU model: other bits


def test_join_registers_the_detected_gpu_and_survives_a_broken_driver(tmp_path, monkeypatch):
    role = make_role(tmp_path)
    role.hardware = None
    role.ledger.record = FakeRecord()

    async def bonded(peer):
        return role.config["stake"]

    async def sync():
        return True

    role.ledger.bonded, role.ledger.record.sync = bonded, sync
    monkeypatch.setattr(membership_module.hardware, "detect",
                        lambda: {"gpu": "NVIDIA H100 80GB HBM3", "gpu_mem_mb": 81079, "gpu_tflops": 51.4,
                                 "cuda_devices": 1})
    asyncio.run(role.membership.join())
    record = role.ledger.record.contributions[-1]["hardware"]
    assert record["gpu"] == "NVIDIA H100 80GB HBM3" and record["gpu_mem_mb"] == 81079 and role.registered

    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    role.hardware, role.registered = None, False
    monkeypatch.setattr(membership_module.hardware, "detect", broken)
    asyncio.run(role.membership.join())
    assert role.registered and role.ledger.record.contributions[-1]["hardware"]["gpu"] == ""


def test_measured_bandwidth_survives_a_restart(tmp_path, monkeypatch):
    for name, value in (("FIRST_BANDWIDTH_CHECK_S", 0.0), ("BANDWIDTH_CHECK_S", 0.01)):
        monkeypatch.setattr(membership_module, name, value)
    home = tmp_path / "home"

    def role_at_home():
        node = Node(local_config(), Identity.generate(), ["compute"], home=home)
        role = node.role("compute")
        role.ledger, role.ledger.record = FakeLedger(), FakeRecord()
        role.hardware = {}
        return role

    role = role_at_home()
    service = FakeBandwidth()
    role.node.services, role.registered = {"bandwidth": service}, True
    service.meter.record_rate("up", 42.0)

    async def follow_briefly():
        follow = asyncio.create_task(role.membership.follow_bandwidth())
        await asyncio.sleep(0.1)
        follow.cancel()

    asyncio.run(follow_briefly())
    assert role.ledger.record.contributions[-1]["hardware"]["bandwidth_mbps"] == 42
    restarted = role_at_home()
    assert restarted.membership.saved_bandwidth() == 42 and restarted.store.results == {}
    (home / "data" / "compute" / "bandwidth.json").write_text('{"link_mbps": true}')
    assert restarted.membership.saved_bandwidth() is None


def test_a_job_whose_task_the_ledger_ended_is_stopped(tmp_path):
    """ADR 0187: the ledger expired the task (its commit deadline passed): the worker stops training
    and its job says why, instead of training on to a refused commitment."""
    role = make_role(tmp_path)
    task = task_doc(role)

    async def scenario():
        training = asyncio.get_running_loop().create_future()   # a job that would run for ever
        role.training.busy = asyncio.ensure_future(training)
        role.board.start(task["task_id"], workers=task["workers"])
        role.board.update(task["task_id"], state="training")
        await tick_with(role, {**task, "status": "assigned", "block_time_ms": 5_000})
        assert not role.training.busy.done()                            # still open on the ledger: go on
        await tick_with(role, {**task, "status": "expired", "block_time_ms": 700_000,
                               "reason": "no worker committed a result by the commit deadline"})
        await asyncio.sleep(0)
        return role.training.busy

    busy = asyncio.run(scenario())
    assert busy.cancelled()
    job = role.jobs[task["task_id"]]
    assert job["state"] == "failed" and "the ledger ended the task: expired (no worker committed" in job["error"]
