"""Node configuration: a schema table, TOML file, environment and flag overrides, validation.

Precedence (lowest first): schema defaults < ``config.toml`` < environment variables
``DEKUBE_<SECTION>_<KEY>`` (e.g. ``DEKUBE_RPC_PORT=9000``, ``DEKUBE_P2P_MAX_CONNECTIONS=64``)
< command-line flags. Every value passes the same typed parsing and checks wherever it comes from,
and every error names its source (file, variable or flag) and the key.

Adding a key is one line in ``SCHEMA`` (section -> key -> ``Key``). Environment variables whose
prefix is not a known section (e.g. ``DEKUBE_HOME``, ``DEKUBE_SLOW``) are not config and are ignored.
"""
from __future__ import annotations

import ipaddress
import json
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from node.p2p.multiaddr import Multiaddr, MultiaddrError

CONFIG_FILE_NAME = "config.toml"
ENV_PREFIX = "DEKUBE_"
ROLE_NAMES = ("validator", "relay", "compute")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """The configuration is invalid; the message names the source and the key."""


# ---------------------------------------------------------------- value checks


def check_port(value: int) -> None:
    if not 0 <= value <= 65535:
        raise ValueError(f"port {value} is out of range 0-65535")


def check_positive(value: int) -> None:
    if value <= 0:
        raise ValueError(f"must be positive, got {value}")


def check_non_negative(value: int) -> None:
    if value < 0:
        raise ValueError(f"must not be negative, got {value}")


def check_non_negative_float(value: float) -> None:
    if value < 0:
        raise ValueError("must be >= 0")


def check_blocks(value: str) -> None:
    """A:B (0 <= A < B) or auto:N (N >= 1); the model's block count is checked when serving starts."""
    kind, _, rest = value.partition(":")
    if kind == "auto":
        if not rest.isdigit() or int(rest) < 1:
            raise ValueError("auto:N needs N >= 1")
    elif not (kind.isdigit() and rest.isdigit() and int(kind) < int(rest)):
        raise ValueError("blocks are A:B with A < B, or auto:N")


def check_host(value: str) -> None:
    if not value or len(value) > 253:
        raise ValueError(f"invalid host {value!r}")
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    if not re.fullmatch(r"(?=.{1,253}$)([A-Za-z0-9-]{1,63})(\.[A-Za-z0-9-]{1,63})*", value):
        raise ValueError(f"invalid host {value!r} (need an IP address or a DNS name)")


def check_origin(value: str) -> None:
    if value == "*":
        return
    parts = urlsplit(value)
    try:
        _ = parts.port  # parses the port: raises on a bad one
    except ValueError:
        raise ValueError(f"invalid origin {value!r} (bad port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"invalid origin {value!r} (need scheme://host[:port], or '*')")


def _parse_multiaddr(value: str) -> Multiaddr:
    try:
        return Multiaddr.parse(value)
    except MultiaddrError as exc:
        raise ValueError(f"bad multiaddr {value!r}: {exc}") from None


def check_listen_multiaddr(value: str) -> None:
    """An address this node can bind: ``/ip4|ip6|dns*/<host>/tcp/<port>``."""
    try:
        _parse_multiaddr(value).tcp_endpoint()
    except MultiaddrError:
        raise ValueError(f"bad listen multiaddr {value!r}: "
                         "need a direct /ip4|ip6|dns/<host>/tcp/<port> address") from None


def check_peer_multiaddr(value: str) -> None:
    """A peer to dial: a direct TCP or relayed (/p2p-circuit) address ending in /p2p/<peer id>."""
    addr = _parse_multiaddr(value)
    if addr.peer_id is None:
        raise ValueError(f"bad peer multiaddr {value!r}: needs a /p2p/<peer id> suffix")
    if not addr.is_relayed:
        try:
            addr.tcp_endpoint()
        except MultiaddrError:
            raise ValueError(
                f"bad peer multiaddr {value!r}: need /ip4|ip6|dns/<host>/tcp/<port>/p2p/<id>") from None


def check_rpc_url(value: str) -> None:
    """Empty, or an http(s) URL with a host (a validator's JSON-RPC)."""
    parts = urllib.parse.urlsplit(value)
    if value and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise ValueError(f"{value!r} is not an http:// or https:// URL")


def check_choice(choices: tuple[str, ...]) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")

    return check


FAULT_MODES = ("", "wrong_segments", "lazy", "poison_zero", "poison_noise", "poison_stealth", "copycat",
               "false_accuser", "rubber_stamp")


def check_fault_mode(value: str) -> None:
    if value in FAULT_MODES or re.fullmatch(r"partial:(0(\.\d+)?|1(\.0+)?)", value):
        return
    raise ValueError(f"{value!r} is not one of {', '.join(FAULT_MODES[1:])} or partial:<q> (0 <= q <= 1)")


def check_roles(value: list[str]) -> None:
    for role in value:
        if role not in ROLE_NAMES:
            raise ValueError(f"unknown role {role!r} (roles: {', '.join(ROLE_NAMES)})")
    if len(set(value)) != len(value):
        raise ValueError("a role is listed twice")


def each(check: Callable[[Any], None]) -> Callable[[list], None]:
    def check_all(values: list) -> None:
        for item in values:
            check(item)

    return check_all


# ---------------------------------------------------------------- schema


@dataclass(frozen=True)
class Key:
    """One config key: its type (str, int, float, bool or list of str), default, help, check."""

    kind: type
    default: Any
    help: str
    check: Callable[[Any], None] | None = None


SCHEMA: dict[str, dict[str, Key]] = {
    "node": {
        "roles": Key(list, [], "roles this node runs: validator, relay, compute (combine freely)", check_roles),
        "log_format": Key(str, "text",
                          "log output: text or json (one JSON object per line)", check_choice(LOG_FORMATS)),
        "log_level": Key(str, "info", "debug, info, warning or error", check_choice(LOG_LEVELS)),
    },
    "p2p": {
        "listen": Key(list, ["/ip4/0.0.0.0/tcp/4001"], "TCP multiaddrs to listen on", each(check_listen_multiaddr)),
        "bootstrap": Key(list, [],
                         "peers to dial at start (/ip4/.../tcp/.../p2p/12D3KooW...)", each(check_peer_multiaddr)),
        "max_connections": Key(int, 256,
                               "most inbound peer connections; at the cap a new one evicts the longest-idle one of"
                               " a peer not protected (committee, bootstrap)", check_positive),
        "max_outbound_connections": Key(int, 256,
                                        "most connections this node dials itself (a budget apart from inbound)",
                                        check_positive),
        "max_pending_inbound": Key(int, 64, "most inbound connections still in their handshake", check_positive),
        "max_pending_inbound_per_ip": Key(int, 8, "of those, most from one IP address", check_positive),
        "max_pending_inbound_per_prefix": Key(int, 16,
                                              "of those, most from one /24 (IPv4) or /48 (IPv6); a full pool evicts"
                                              " the oldest pending socket of the most-represented prefix",
                                              check_positive),
        "max_connections_per_peer": Key(int, 8,
                                        "connections to one peer, shared + bulk (a relay raises it to fit one per bulk"
                                        " circuit)", check_positive),
    },
    "rpc": {
        "enabled": Key(bool, True, "serve HTTP: /health, /status, /metrics, JSON-RPC and /ws"),
        "host": Key(str, "127.0.0.1", "address the HTTP server binds (keep 127.0.0.1 unless firewalled)", check_host),
        "port": Key(int, 8645, "HTTP port (0 picks a free port)", check_port),
        "max_body_bytes": Key(int, 1 << 20, "largest accepted HTTP/JSON-RPC request body", check_positive),
        "max_batch": Key(int, 100, "most requests in one JSON-RPC batch", check_positive),
        "ws_queue": Key(int, 256, "messages queued per websocket subscription before it is dropped", check_positive),
        "max_connections": Key(int, 256,
                               "most open HTTP connections; at the cap a new one evicts the longest-waiting idle one",
                               check_positive),
        "header_timeout": Key(float, 10.0,
                              "seconds a new HTTP connection has to send its request headers", check_positive),
        "idle_timeout": Key(float, 60.0, "seconds an idle keep-alive HTTP connection is kept", check_positive),
        "max_websockets": Key(int, 128, "most open websockets (a pool apart from HTTP connections); at the cap a"
                              " new one evicts the idlest of the most-represented client", check_positive),
        "max_websockets_per_client": Key(int, 16, "most open websockets from one client IP address", check_positive),
        "ws_idle_timeout": Key(float, 300.0, "seconds a websocket with no message either way is kept",
                               check_positive),
        "allowed_hosts": Key(list, ["localhost"],
                             "Host names accepted (IP addresses always are; '*': any): guards against DNS rebinding"),
        "allowed_origins": Key(list, ["http://localhost", "http://127.0.0.1", "http://[::1]"],
                               "browser Origins accepted, scheme://host[:port] (no port: any; '*': any); requests "
                               "without Origin are always accepted", each(check_origin)),
        "cors": Key(bool, False, "send CORS headers (and answer preflights) for allowed_origins"),
    },
    "consensus": {
        "chain_id": Key(str, "dekube-local", "identifier of the chain; signatures cover it"),
        "genesis_file": Key(str, "genesis.json", "genesis document, relative to the node home"),
        "timeout_propose": Key(float, 1.0,
                               "seconds to wait for a proposal in round 0 (+50% per round)", check_positive),
        "timeout_vote": Key(float, 0.5,
                            "seconds to wait for more prevotes/precommits in round 0 (+50% per round)", check_positive),
        "empty_block_wait": Key(float, 0.3,
                                "seconds a proposer waits for transactions before an empty block", check_positive),
        "max_block_txs": Key(int, 5000, "most transactions this node puts in a block it proposes", check_positive),
        "mempool_max_txs": Key(int, 50000, "most transactions held in the mempool", check_positive),
        "verify_db": Key(str, "auto",
                         "start-up check of the chain database: full (read every block), recent (state and the "
                         "last 1000 blocks), auto (full up to 512 MiB, else recent); docs/adr/0142",
                         check_choice(("auto", "full", "recent"))),
    },
    "ledger": {
        "rpc_urls": Key(list, [],
                        "validator JSON-RPC URLs the node's ledger gateway reads from and sends to, with failover; "
                        "unused when this node is a validator (its own ledger); also tried: [relay] ledger_rpc, "
                        "[compute] rpc_url, [relay] receipt_rpc", each(check_rpc_url)),
    },
    "relay": {
        "allow_list": Key(list, [], "peer IDs admitted to reserve and relay without a ledger registration"),
        "min_stake": Key(int, 0, "stake a ledger-registered peer needs to be admitted by this relay"),
        "min_client_balance": Key(int, 1, "balance that admits an account with no node record (a task owner's "
                                          "command-line client) where min_stake is 0; 0 admits none",
                                  check_non_negative),
        "stake": Key(int, 100, "stake the relay keeps bonded (bonds the difference at start; the ledger pays "
                               "receipts only to relays with the chain's min_relay_stake)", check_non_negative),
        "reservation_ttl": Key(int, 3600, "seconds a reservation and its voucher last", check_positive),
        "max_reservations_per_ip": Key(int, 16, "reservations held at once by peers behind one IP", check_positive),
        "max_circuits_per_peer": Key(int, 64, "circuits one peer may have open through this relay", check_positive),
        "price_per_mib": Key(int, 1, "price per relayed MiB written into usage receipts", check_positive),
        "receipt_rpc": Key(str, "",
                           "legacy: one more validator JSON-RPC URL for the node's ledger gateway (see [ledger] "
                           "rpc_urls)", check_rpc_url),
        "ledger_rpc": Key(str, "",
                          "legacy: a validator JSON-RPC URL for the node's ledger gateway, tried before [compute] "
                          "rpc_url (see [ledger] rpc_urls)", check_rpc_url),
        "lookup_ttl": Key(float, 10.0, "seconds a ledger admission lookup over JSON-RPC is cached", check_positive),
        "relays": Key(list, [],
                      "relays this node reserves on when it needs to (.../tcp/N/p2p/<relay id>); empty: no relay "
                      "client", each(check_peer_multiaddr)),
        "reserve": Key(bool, False,
                       "reserve on [relay] relays even when reachable; false: only when AutoNAT through them says "
                       "private"),
        "reservations": Key(int, 2,
                            "relays reserved on at once (those with the lowest round-trip time)", check_positive),
        "max_price_per_mib": Key(int, 1,
                                 "highest price per relayed MiB this node co-signs in usage receipts", check_positive),
        "hole_punch": Key(bool, True,
                          "with [relay] relays: upgrade relayed connections to direct ones by DCUtR hole punching"),
    },
    "artifacts": {
        "max_size_mb": Key(int, 4096, "largest artifact this node adds, stores or fetches (MiB)", check_positive),
        "quota_mb": Key(int, 65536, "total disk the artifact store may use (MiB, at least max_size_mb): to make "
                        "room, artifacts no open task of this node needs are deleted, oldest first", check_positive),
        "own_retention_s": Key(float, 7 * 24 * 3600.0,
                               "seconds the artifacts this node made (its results) stay kept after they were made, "
                               "so owners can fetch them", check_positive),
        "max_uploads": Key(int, 32, "artifact streams served at once to all peers", check_positive),
        "max_uploads_per_peer": Key(int, 4, "artifact streams served at once to one peer", check_positive),
        "max_uploads_unknown": Key(int, 16, "of max_uploads, the streams peers without stake or open business"
                                   " share (the rest is reserved for staked peers, a task's crew and the committee)",
                                   check_positive),
        "window_chunks": Key(int, 8, "1 MiB chunks in flight per holder while fetching", check_positive),
        "request_chunks": Key(int, 4, "chunks asked for in one request (at most window_chunks)", check_positive),
        "stall_timeout": Key(float, 30.0,
                             "seconds a holder may leave a request unanswered before it is retried or dropped",
                             check_positive),
    },
    "compute": {
        "rpc_url": Key(str, "",
                       "legacy: a validator JSON-RPC URL for the node's ledger gateway (see [ledger] rpc_urls)",
                       check_rpc_url),
        "stake": Key(int, 1_000, "stake the compute node keeps bonded (bonds the difference at start)"),
        "bandwidth_mbps": Key(int, 100, "upload bandwidth declared in the node registration (Mbit/s)"),
        "poll_interval": Key(float, 0.5,
                             "seconds before retrying after the ledger failed a look at the tasks (task changes arrive"
                             " on the tasks subscription)", check_positive),
        "audit": Key(bool, True, "replay and audit other workers' results (as a verifier) when idle"),
        "hours": Key(str, "", "local hours when new tasks are taken, e.g. 22-7; empty: any (ADR 0198)"),
        "max_task_s": Key(int, 0, "the longest task taken, by its declared duration in seconds; 0: any",
                          check_non_negative),
        "cuda_devices": Key(int, -1, "CUDA devices lent: -1 all, 0 none (CPU tasks only)"),
        "portable_cpu": Key(bool, True,
                            "train on CPU under the portable CPU profile (ADR 0166: AVX2 kernels, bitwise identical "
                            "on every x86-64 CPU with AVX2); false: the machine's fastest kernels, and the node "
                            "offers no CPU profile"),
        "allreduce_mode": Key(str, "butterfly",
                              "all-reduce algorithm: butterfly or ring", check_choice(("butterfly", "ring"))),
        "fault_inject": Key(str, "",
                            "TESTING ONLY: an adversary mode (docs/adr/0167): worker lazy | partial:<q> | poison_zero"
                            " | poison_noise | poison_stealth | copycat | wrong_segments,"
                            " verifier false_accuser | rubber_stamp",
                            check_fault_mode),
    },
    "serve": {
        "model": Key(str, "",
                     "with the compute role: serve this model's blocks (random:<L>x<W>[:heads][@seed] or a "
                     "char-transformer .safetensors path; ADRs 0171-0177); empty: no serving"),
        "blocks": Key(str, "auto:1",
                      "blocks to serve: A:B, or auto:N (the N thinnest blocks in the ledger's coverage)",
                      check_blocks),
        "price": Key(int, 0, "price per GFLOP billed with co-signed receipts (0: free)", check_non_negative),
        "credit_tokens": Key(int, 1024, "tokens served ahead of a client's receipt", check_positive),
        "max_sessions": Key(int, 64, "inference sessions held at once", check_positive),
        "device": Key(str, "auto", "where the served blocks compute: auto (CUDA when torch sees it, else CPU), cpu or "
                      "cuda (ADR 0179; cuda without a CUDA device stops the node at start)",
                      check_choice(("auto", "cpu", "cuda"))),
        "claim_every": Key(float, 30.0,
                           "seconds between receipt claims, referee duty and announcement refresh", check_positive),
        "rebalance_every": Key(float, 0.0,
                               "seconds between coverage checks moving an idle server to thinner blocks (0: never)",
                               check_non_negative_float),
    },
}


# ---------------------------------------------------------------- parsing


def parse_text(section: str, key: str, text: str) -> Any:
    """Parse a value given as text (environment variable or flag) into the key's type.

    Lists are comma-separated; booleans accept true/false, 1/0, yes/no, on/off.
    """
    spec = _spec(section, key)
    if spec.kind is str:
        return text
    if spec.kind is int:
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if spec.kind is float:
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    if spec.kind is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if spec.kind is list:
        return [item.strip() for item in text.split(",") if item.strip()]
    raise AssertionError(f"unsupported kind {spec.kind}")


def _spec(section: str, key: str) -> Key:
    if section not in SCHEMA:
        raise KeyError(f"unknown section [{section}] (sections: {', '.join(SCHEMA)})")
    if key not in SCHEMA[section]:
        raise KeyError(f"unknown key {key!r} in [{section}] (keys: {', '.join(SCHEMA[section])})")
    return SCHEMA[section][key]


def _validate(section: str, key: str, value: Any, source: str) -> Any:
    try:
        spec = _spec(section, key)
    except KeyError as exc:
        raise ConfigError(f"{source}: {exc.args[0]}") from None
    where = f"{source}: [{section}] {key}"
    if spec.kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings, got {_show(value)}")
        value = list(value)
    elif spec.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {_show(value)}")
        value = float(value)
    elif spec.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {_show(value)}")
    elif not isinstance(value, spec.kind):
        raise ConfigError(f"{where} must be a {spec.kind.__name__}, got {_show(value)}")
    if spec.check is not None:
        try:
            spec.check(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return value


def _show(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


# ---------------------------------------------------------------- the config object


class Config:
    """Validated settings: ``config["rpc"]["port"]`` or ``config.get("rpc", "port")``."""

    def __init__(self, values: dict[str, dict[str, Any]]):
        self._values = values

    def __getitem__(self, section: str) -> dict[str, Any]:
        return dict(self._values[section])

    def get(self, section: str, key: str) -> Any:
        return self._values[section][key]

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {section: dict(keys) for section, keys in self._values.items()}

    def to_toml(self) -> str:
        return render_toml(self._values)


def defaults() -> Config:
    return Config({s: {k: _copy(spec.default) for k, spec in keys.items()} for s, keys in SCHEMA.items()})


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def load_config(
    file: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, str], str] | None = None,
) -> Config:
    """Build the effective config: defaults < ``file`` (if given) < ``env`` < ``overrides``.

    ``overrides`` maps (section, key) to a flag's text value; a missing or invalid file, an unknown
    section or key, a value of the wrong type or one failing its check raises ConfigError.
    """
    values = defaults().as_dict()
    if file is not None:
        for section, key, value in _read_file(Path(file)):
            values[section][key] = _validate(section, key, value, str(file))
    for name, text in sorted((env or {}).items()):
        target = _env_target(name)
        if target is None:
            continue
        section, key = target
        source = f"environment variable {name}"
        values[section][key] = _validate(section, key, _parse_or_fail(section, key, text, source), source)
    for (section, key), text in (overrides or {}).items():
        source = "command line"
        values[section][key] = _validate(section, key, _parse_or_fail(section, key, text, source), source)
    return Config(values)


def _parse_or_fail(section: str, key: str, text: str, source: str) -> Any:
    try:
        return parse_text(section, key, text)
    except KeyError as exc:
        raise ConfigError(f"{source}: {exc.args[0]}") from None
    except ValueError as exc:
        raise ConfigError(f"{source}: [{section}] {key}: {exc}") from None


def _env_target(name: str) -> tuple[str, str] | None:
    """Map ``DEKUBE_RPC_PORT`` to ("rpc", "port"); None for variables outside config sections."""
    if not name.startswith(ENV_PREFIX):
        return None
    rest = name[len(ENV_PREFIX):].lower()
    for section in SCHEMA:
        if rest.startswith(section + "_"):
            return section, rest[len(section) + 1:]
    return None


def _read_file(path: Path) -> list[tuple[str, str, Any]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found; create it with 'dekube-node init --home DIR'") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    items = []
    for section, table in doc.items():
        if section not in SCHEMA:
            raise ConfigError(f"{path}: unknown section [{section}] (sections: {', '.join(SCHEMA)})")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {section!r} must be a [section] table")
        for key, value in table.items():
            items.append((section, key, value))
    return items


# ---------------------------------------------------------------- writing TOML


def render_toml(values: Mapping[str, Mapping[str, Any]]) -> str:
    """Write a config as commented TOML that tomllib reads back to the same values."""
    lines = ["# dekube node configuration. Environment DEKUBE_<SECTION>_<KEY> and flags override it.", ""]
    for section, keys in values.items():
        lines.append(f"[{section}]")
        for key, value in keys.items():
            spec = SCHEMA.get(section, {}).get(key)
            if spec is not None:
                lines.append(f"# {spec.help}")
            lines.append(f"{key} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes (\" \\ \n \uXXXX) are valid TOML basic-string escapes; TOML also
        # forbids a raw DEL, which JSON leaves alone.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
