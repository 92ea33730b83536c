"""Network descriptions for ``dekube-node provide --network``: which validators to ask for the genesis,
the genesis hash it must have, and the bootstrap peers (docs/adr/0195).

``--network`` is a name from the ``networks.toml`` shipped in this package (cli/data), a path to a
description file, or an ``https://`` (or ``http://``) URL of one. A description is TOML with ``rpc``
(validator JSON-RPC URLs), ``genesis_hash`` (hex sha256, ``Genesis.hash``) or ``genesis_file`` (a
genesis on this machine whose hash is trusted: the local dev chain's), and optionally ``bootstrap``
(multiaddrs; default: the genesis validators' listen addresses) and ``description``. Files and
downloads are read up to MAX_DESCRIPTION_BYTES.
"""
from __future__ import annotations

import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cli.errors import CliError
from cli.genesis import read_genesis
from consensus.genesis import Genesis, GenesisError
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError

KNOWN_FILE = Path(__file__).parent / "data" / "networks.toml"
MAX_DESCRIPTION_BYTES = 64 * 1024
FETCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Network:
    name: str
    rpc: tuple[str, ...]
    genesis_hash: str            # hex, lower case
    bootstrap: tuple[str, ...] = ()
    description: str = ""


def known_networks() -> dict[str, dict]:
    return tomllib.loads(KNOWN_FILE.read_text(encoding="utf-8")).get("networks", {})


def resolve(spec: str) -> Network:
    """The network ``spec`` names (a known name, a file or a URL); a CliError says what is wrong."""
    known = known_networks()
    if spec in known:
        return parse(spec, known[spec])
    if spec.startswith(("https://", "http://")):
        return parse(spec, _loads(spec, _download(spec)))
    path = Path(spec).expanduser()
    if path.is_file():
        with open(path, "rb") as f:
            return parse(str(path), _loads(str(path), f.read(MAX_DESCRIPTION_BYTES + 1)))
    raise CliError(f"unknown network {spec!r}: known are {', '.join(sorted(known))}; or give a description "
                   "file or URL")


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
            return answer.read(MAX_DESCRIPTION_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot fetch the network description {url}: {exc}") from None


def _loads(where: str, data: bytes) -> dict:
    if len(data) > MAX_DESCRIPTION_BYTES:
        raise CliError(f"network description {where} is over {MAX_DESCRIPTION_BYTES} bytes")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"network description {where} is not valid TOML: {exc}") from None


def _strings(where: str, doc: dict, key: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CliError(f"network {where}: {key} must be a list of strings")
    return tuple(value)


def parse(name: str, doc: dict) -> Network:
    rpc = _strings(name, doc, "rpc")
    if not rpc:
        raise CliError(f"network {name}: no rpc URL to fetch the genesis from")
    genesis_hash = doc.get("genesis_hash")
    if genesis_hash is None and isinstance(doc.get("genesis_file"), str):
        genesis_file = Path(doc["genesis_file"]).expanduser()
        if not genesis_file.exists():
            raise CliError(f"network {name}: its genesis hash is that of {genesis_file}, which is missing "
                           "(start the local chain first: dekube-node start --dev)")
        genesis_hash = read_genesis(genesis_file).hash.hex()
    if not isinstance(genesis_hash, str) or len(genesis_hash) != 64 or not _is_hex(genesis_hash):
        raise CliError(f"network {name}: genesis_hash must be 64 hex digits")
    return Network(name, rpc, genesis_hash.lower(), _strings(name, doc, "bootstrap"), str(doc.get("description", "")))


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def fetch_genesis(network: Network) -> tuple[Genesis, str]:
    """The genesis from the first of the network's RPC URLs that answers, checked against its hash;
    returns it and the URL. A genesis with another hash is refused whoever serves it."""
    failures = []
    for url in network.rpc:
        try:
            answer = jsonrpc.call(url, "dkb_getGenesis")
            genesis = Genesis.from_obj(answer["genesis"])
        except (LedgerUnavailable, RpcAnswerError) as exc:
            failures.append(f"{url}: {exc}")
            continue
        except (GenesisError, KeyError, TypeError) as exc:
            failures.append(f"{url}: not a genesis ({exc})")
            continue
        if genesis.hash.hex() != network.genesis_hash:
            raise CliError(f"genesis hash mismatch: {url} serves chain {genesis.chain_id!r} with genesis hash "
                           f"{genesis.hash.hex()}, but network {network.name} names {network.genesis_hash}; "
                           "refusing to join (a wrong or hostile node, or an outdated network description)")
        return genesis, url
    raise CliError(f"cannot fetch the genesis of network {network.name}: " + "; ".join(failures))


def bootstrap_addrs(network: Network, genesis: Genesis) -> list[str]:
    if network.bootstrap:
        return list(network.bootstrap)
    return [addr for v in genesis.validators for addr in v.listen_addrs]
