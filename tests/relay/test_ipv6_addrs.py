"""Which of the host's IPv6 addresses a hole punch offers (relay/ipv6_addrs.py, ADR 0224): global
unicast addresses that are usable; never link-local, unique local, loopback, mapped, tentative,
deprecated or failed ones; junk lines are skipped and the list is bounded."""
from relay.ipv6_addrs import MAX_ADDRESSES, global_ipv6, parse_if_inet6

GLOBAL = "20010db8000100000000000000000002 03 40 00 80     eth0"
SAMPLE = "\n".join([
    "fe8000000000000000fc00fffe000001 03 40 20 80     eth0",    # link-local
    "fd000000000000000000000000000002 03 40 00 80     eth0",    # unique local
    "00000000000000000000000000000001 01 80 10 80       lo",    # loopback
    "00000000000000000000ffff0a000001 03 60 00 80     eth0",    # IPv4-mapped
    "20010db8000200000000000000000002 03 40 00 40     eth0",    # tentative
    "20010db8000300000000000000000002 03 40 00 20     eth0",    # deprecated
    "20010db8000400000000000000000002 03 40 00 08     eth0",    # duplicate address detection failed
    "not a line", "zz010db8000100000000000000000002 03 40 00 80     eth0", "",
    GLOBAL, GLOBAL,
    "20010db8000500000000000000000002 03 40 00 01     eth0",    # temporary (privacy): usable
])


def test_only_usable_global_addresses_are_offered():
    assert parse_if_inet6(SAMPLE) == ["2001:db8:1::2", "2001:db8:5::2"]


def test_the_list_is_bounded_and_a_missing_file_gives_none(tmp_path):
    many = "\n".join(f"20010db8{i:04x}00000000000000000002 03 40 00 80 eth0" for i in range(1, 50))
    assert len(parse_if_inet6(many)) == MAX_ADDRESSES
    assert global_ipv6(tmp_path / "absent") == []
    (tmp_path / "if_inet6").write_text(SAMPLE)
    assert global_ipv6(tmp_path / "if_inet6") == ["2001:db8:1::2", "2001:db8:5::2"]
