"""The one error every port-mapping failure raises: a router that does not answer, refuses, or
answers junk (a hostile LAN device included) ends here, never in a crash of the node."""
from __future__ import annotations


class PortMapError(Exception):
    """A port-mapping exchange failed; the message says which protocol and why."""
