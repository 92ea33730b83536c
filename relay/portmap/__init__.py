"""Port mapping (ADR 0221): a node behind a home router asks that router to forward a public TCP port
to its listen port, by PCP (RFC 6887), NAT-PMP (RFC 6886) or UPnP-IGD, and advertises the mapped
address. Wire formats are sans-I/O (`natpmp`, `pcp`, `igd`); `gateway` finds the router;
`transport` does the UDP/HTTP exchanges; `mapper` tries the protocols in order within a budget;
`keeper` holds one mapping (renewal, deletion); `service` is the node service that maps,
advertises, renews and deletes, configured by `settings` (``[nat]``); every failure is an
`errors.PortMapError`."""
