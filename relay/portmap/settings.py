"""The port-mapping config section, ``[nat]`` (ADR 0221; cli/assembly.py hands it to the node's config)."""
from __future__ import annotations

from node.config import Key

SECTIONS: dict[str, dict[str, Key]] = {
    "nat": {
        "port_mapping": Key(bool, True,
                            "ask the home router (the default route's gateway) for a TCP port mapping by PCP, "
                            "NAT-PMP or UPnP-IGD and advertise the public address; renewed while the node runs, "
                            "deleted when it stops"),
    },
}
