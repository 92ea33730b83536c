"""Tests on the emulated internet (devtools/netlab: network namespaces, NAT routers, tbf); they need root."""
