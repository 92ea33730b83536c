"""The emulated internet for relay and NAT-traversal tests (network namespaces, NAT routers, tbf)."""
