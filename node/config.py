"""Node configuration: a schema table, TOML file, environment and flag overrides, validation.

Precedence (lowest first): schema defaults < ``config.toml`` < environment variables
``DEKUBE_<SECTION>_<KEY>`` (e.g. ``DEKUBE_RPC_PORT=9000``, ``DEKUBE_P2P_MAX_CONNECTIONS=64``)
< command-line flags. Every value passes the same typed parsing and checks wherever it comes from,
and every error names its source (file, variable or flag) and the key.

Adding a key is one line in its section (section -> key -> ``Key``). ``SCHEMA`` holds the node's own
sections (node, p2p, rpc, ledger, artifacts); each role and service owns its section and defaults
(consensus/validator/settings.py, relay/settings.py, ml/settings.py), handed in through
``node.plugins.install`` (``add_sections``; ADR 0201). Environment variables whose prefix is not a
known section (e.g. ``DEKUBE_HOME``, ``DEKUBE_SLOW``) are not config and are ignored.
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
    """An address this node can bind: ``/ip4|ip6|dns*/<host>/tcp/<port>`` or ``/ip4|ip6/<ip>/udp/<port>/quic-v1``."""
    try:
        _parse_multiaddr(value).direct_endpoint()
    except MultiaddrError:
        raise ValueError(f"bad listen multiaddr {value!r}: need a direct /ip4|ip6|dns/<host>/tcp/<port> "
                         "or /ip4|ip6/<ip>/udp/<port>/quic-v1 address") from None


def check_peer_multiaddr(value: str) -> None:
    """A peer to dial: a direct TCP or QUIC or a relayed (/p2p-circuit) address ending in /p2p/<peer id>."""
    addr = _parse_multiaddr(value)
    if addr.peer_id is None:
        raise ValueError(f"bad peer multiaddr {value!r}: needs a /p2p/<peer id> suffix")
    if not addr.is_relayed:
        try:
            addr.direct_endpoint()
        except MultiaddrError:
            raise ValueError(f"bad peer multiaddr {value!r}: need /ip4|ip6|dns/<host>/tcp/<port>/p2p/<id> "
                             "or /ip4|ip6/<ip>/udp/<port>/quic-v1/p2p/<id>") from None


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
    "ledger": {
        "rpc_urls": Key(list, [],
                        "validator JSON-RPC URLs the node's ledger gateway reads from and sends to, with failover; "
                        "unused when this node is a validator (its own ledger); also tried: [relay] ledger_rpc, "
                        "[compute] rpc_url, [relay] receipt_rpc", each(check_rpc_url)),
    },
    "artifacts": {
        "max_size_mb": Key(int, 4096, "largest artifact this node adds, stores or fetches (MiB)", check_positive),
        "quota_mb": Key(int, 65536, "total disk the artifact store may use (MiB, at least max_size_mb): to make "
                        "room, artifacts no open task of this node needs are deleted, oldest first (mirrored epoch "
                        "states pinned take at most a quarter of it)", check_positive),
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
}


_OWNED: dict[str, dict[str, Key]] = {}   # the sections roles and services own, once installed


def add_sections(sections: Mapping[str, Mapping[str, Key]]) -> None:
    """Make the config know `sections` (owned by roles and services); the same section twice must be
    the same keys."""
    for name, keys in sections.items():
        if name in SCHEMA or (name in _OWNED and _OWNED[name] != dict(keys)):
            raise ValueError(f"config section [{name}] is already defined differently")
        _OWNED[name] = dict(keys)


def schema() -> dict[str, dict[str, Key]]:
    """Every known section: the node's own, then those added."""
    return {**SCHEMA, **_OWNED}


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
    known = schema()
    if section not in known:
        raise KeyError(f"unknown section [{section}] (sections: {', '.join(known)})")
    if key not in known[section]:
        raise KeyError(f"unknown key {key!r} in [{section}] (keys: {', '.join(known[section])})")
    return known[section][key]


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
    return Config({s: {k: _copy(spec.default) for k, spec in keys.items()} for s, keys in schema().items()})


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
    for section in schema():
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
        if section not in schema():
            raise ConfigError(f"{path}: unknown section [{section}] (sections: {', '.join(schema())})")
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
            spec = schema().get(section, {}).get(key)
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
