"""Storage attacks: one byte flipped in an SST data block of a stopped validator's chain database.

The node must refuse to start with ONE clear line naming the corruption and exit code 1 before it
listens (no traceback, no "HTTP server listening"); a healthy database still starts (docs/adr/0142).
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from consensus.block import build_block
from consensus.validator.chainstore import ChainStore
from consensus.validator.storage import Storage
from tests.consensus.test_ledger_kit import CHAIN, Chain, ident

REPO = Path(__file__).resolve().parents[2]

START_TIMEOUT = 45.0


def cli_env():
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def validator_home(tmp_path: Path, blocks: int = 90) -> Path:
    """A validator home (not in the committee) whose chain database holds ``blocks`` blocks (within the first
    epoch: no committee records needed), flushed to table files."""
    home = tmp_path / "node"
    init = subprocess.run([sys.executable, "-m", "cli.main", "init", "--home", str(home), "--role", "validator",
                              "--insecure-unencrypted-key"],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    chain = Chain()
    (home / "genesis.json").write_text(chain.genesis.to_json(), encoding="utf-8")
    path = str(home / "data" / "chain")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with Storage.open(path, chain.genesis) as storage:
        ChainStore(storage).committee_for(1, chain.ledger)  # the first epoch's committee, as a validator stores it
        for _ in range(blocks):
            txs = [chain.tx(ident(1 + i % 5), "transfer", {"to": ident(6).peer_id, "amount": 3}) for i in range(20)]
            led = chain.ledger
            block = build_block(CHAIN, led.height + 1, led.height, led.last_block_hash, led.app_hash,
                                chain.proposer_identity, led.beacon, [tx.raw for tx in txs])
            chain.nonces.clear()
            storage.commit_block(block, led.apply_block(block))
    db = Rdict(path, Options(raw_mode=True))  # move everything from the memtable and log into table files
    db.flush()
    db.compact_range(None, None)
    db.close()
    return home


def flip_sst_byte(home: Path) -> str:
    """Flip one byte in the middle of the largest table file (inside a data block, far from the footer)."""
    tables = glob.glob(str(home / "data" / "chain" / "*.sst"))
    assert tables, "no table file to damage"
    name = max(tables, key=os.path.getsize)
    size = os.path.getsize(name)
    assert size > 64 * 1024, f"table file too small to hold data blocks: {size} bytes"
    with open(name, "r+b") as f:
        f.seek(size // 3)
        byte = f.read(1)
        f.seek(size // 3)
        f.write(bytes([byte[0] ^ 0x5A]))
    return name


def start(home: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "start", "--home", str(home), "--chain-id", CHAIN, "--rpc-port", "0",
         "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json"],
        cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_flipped_byte_in_a_table_file_stops_the_node_before_it_listens(tmp_path):
    home = validator_home(tmp_path)
    flip_sst_byte(home)
    proc = start(home)
    try:
        output, _ = proc.communicate(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail("the node kept running on a corrupt database:\n" + output)
    assert proc.returncode == 1, output
    assert "Traceback" not in output and "ExceptionGroup" not in output, output
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    errors = [r for r in records if r.get("level") in ("ERROR", "CRITICAL", "error", "critical")]
    assert len(errors) == 1 and not any("exc" in r for r in records), output
    message = errors[0]["msg"]
    assert "cannot open the chain database" in message and "orruption" in message, message
    assert str(home / "data" / "chain") in message and "backup" in message, message
    messages = [r.get("msg") for r in records]
    assert "HTTP server listening" not in messages and "node started" not in messages, output


def test_healthy_database_starts_and_stops_cleanly(tmp_path):
    home = validator_home(tmp_path)
    proc = start(home)
    seen = []
    try:
        deadline = time.monotonic() + START_TIMEOUT
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("{") and json.loads(line).get("msg") == "validator started":
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail("the node exited:\n" + "".join(seen))
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    output = "".join(seen) + output
    assert proc.returncode == 0, output
    messages = [json.loads(line).get("msg") for line in output.splitlines() if line.startswith("{")]
    assert "chain database verified" in messages, output
    assert messages.index("chain database verified") < messages.index("HTTP server listening"), output
