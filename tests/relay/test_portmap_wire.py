"""Port mapping wire formats (ADR 0221): NAT-PMP (RFC 6886) and PCP MAP (RFC 6887) packets built by
hand from the RFCs' layouts, UPnP-IGD's SSDP/description/SOAP parsing, the default gateway from
/proc/net/route, and junk answers of every kind ending in a clear PortMapError."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.portmap import igd, natpmp, pcp
from relay.portmap.errors import PortMapError
from relay.portmap.gateway import default_gateway

NONCE = bytes(range(12))


# ---- NAT-PMP
def test_natpmp_requests_match_rfc6886_layout():
    assert natpmp.external_address_request() == b"\x00\x00"
    # version 0, opcode 2 (TCP), reserved 0, internal 4001, suggested external 4001, lifetime 7200
    assert natpmp.map_request(4001, 4001, 7200) == bytes.fromhex("0002 0000 0fa1 0fa1 00001c20".replace(" ", ""))
    assert natpmp.map_request(4001, 0, 0) == bytes.fromhex("00020000 0fa1 0000 00000000".replace(" ", ""))
    with pytest.raises(ValueError):
        natpmp.map_request(70000, 0, 0)


def test_natpmp_answers_parse():
    ext = natpmp.parse_external_address(struct.pack("!BBHI4s", 0, 128, 0, 99, bytes([11, 99, 0, 101])))
    assert (ext.epoch, ext.address) == (99, "11.99.0.101")
    got = natpmp.parse_map(struct.pack("!BBHIHHI", 0, 130, 0, 5, 4001, 4002, 3600))
    assert (got.internal_port, got.external_port, got.lifetime) == (4001, 4002, 3600)


@pytest.mark.parametrize("data, why", [
    (b"", "too short"),
    (b"\x00\x82\x00", "too short"),
    (struct.pack("!BBHIHHI", 1, 130, 0, 5, 4001, 4002, 3600), "version 1"),
    (struct.pack("!BBHIHHI", 0, 129, 0, 5, 4001, 4002, 3600), "opcode 129"),
    (struct.pack("!BBHIHHI", 0, 130, 2, 5, 4001, 4002, 3600), "not authorized"),
    (struct.pack("!BBHIHHI", 0, 130, 77, 5, 4001, 4002, 3600), "result 77"),
    (struct.pack("!BBHIHHI", 0, 130, 0, 5, 4001, 4002, 3600) + b"x" * 900, "bytes, expected 16"),
])
def test_natpmp_junk_map_answers_are_refused(data, why):
    with pytest.raises(PortMapError, match=why):
        natpmp.parse_map(data)


def test_natpmp_unspecified_external_address_is_refused():
    with pytest.raises(PortMapError, match="no external address"):
        natpmp.parse_external_address(struct.pack("!BBHI4s", 0, 128, 0, 1, bytes(4)))


# ---- PCP
def pcp_answer(result=0, lifetime=7200, nonce=NONCE, proto=6, internal=4001, external=4001,
               address="11.99.0.101", version=2, r_op=0x81, tail=b"") -> bytes:
    header = struct.pack("!BBBBII12x", version, r_op, 0, result, lifetime, 42)
    mapped = bytes(10) + b"\xff\xff" + bytes(int(x) for x in address.split("."))
    return header + nonce + struct.pack("!B3xHH", proto, internal, external) + mapped + tail


def test_pcp_map_request_matches_rfc6887_layout():
    request = pcp.map_request("192.168.1.2", NONCE, 4001, 4001, 7200)
    assert len(request) == 60
    assert request[:8] == bytes([2, 1, 0, 0]) + struct.pack("!I", 7200)
    assert request[8:24] == bytes(10) + b"\xff\xff" + bytes([192, 168, 1, 2])   # IPv4-mapped client address
    assert request[24:36] == NONCE
    assert request[36:44] == bytes([6, 0, 0, 0]) + struct.pack("!HH", 4001, 4001)
    assert request[44:60] == bytes(10) + b"\xff\xff" + bytes(4)                 # any external address
    with pytest.raises(ValueError):
        pcp.map_request("192.168.1.2", b"short", 1, 1, 1)


def test_pcp_answer_parses():
    got = pcp.parse_map(pcp_answer(external=40001, lifetime=600), NONCE)
    assert (got.external_address, got.external_port, got.internal_port, got.lifetime, got.epoch) == \
        ("11.99.0.101", 40001, 4001, 600, 42)


def test_pcp_unsupported_version_falls_back():
    with pytest.raises(pcp.Unsupported):     # a NAT-PMP server's answer to a version-2 request
        pcp.parse_map(struct.pack("!BBHI", 0, 129, 1, 7), NONCE)
    with pytest.raises(pcp.Unsupported):     # a PCP server of another version
        pcp.parse_map(pcp_answer(result=1), NONCE)


@pytest.mark.parametrize("data, why", [
    (b"\x02", "too short"),
    (pcp_answer(r_op=0x01), "R/opcode"),
    (pcp_answer(nonce=b"x" * 12), "another mapping nonce"),
    (pcp_answer(result=2), "NOT_AUTHORIZED"),
    (pcp_answer(result=200), "result 200"),
    (pcp_answer(proto=17), "protocol 17"),
    (pcp_answer()[:50], "bad size"),
    (pcp_answer(tail=b"\x00" * 2000), "bad size"),
])
def test_pcp_junk_answers_are_refused(data, why):
    with pytest.raises(PortMapError, match=why):
        pcp.parse_map(data, NONCE)


# ---- UPnP-IGD
SSDP_OK = (b"HTTP/1.1 200 OK\r\nCACHE-CONTROL: max-age=120\r\nST: urn:schemas-upnp-org:device:"
           b"InternetGatewayDevice:1\r\nLocation: http://192.168.1.1:5000/rootDesc.xml\r\n\r\n")
DESCRIPTION = b"""<?xml version="1.0"?><root xmlns="urn:schemas-upnp-org:device-1-0"><device><deviceList>
<device><serviceList>
<service><serviceType>urn:schemas-upnp-org:service:WANIPConnection:1</serviceType>
<controlURL>/ctl/v1</controlURL></service>
<service><serviceType>urn:schemas-upnp-org:service:WANIPConnection:2</serviceType>
<controlURL>/ctl/IPConn</controlURL></service>
</serviceList></device></deviceList></device></root>"""


def test_ssdp_answer_gives_the_gateways_description_url():
    assert "M-SEARCH * HTTP/1.1" in igd.m_search().decode()
    assert igd.parse_ssdp(SSDP_OK, "192.168.1.1") == "http://192.168.1.1:5000/rootDesc.xml"


@pytest.mark.parametrize("data, why", [
    (SSDP_OK.replace(b"192.168.1.1", b"192.168.1.66"), "away from the gateway"),
    (SSDP_OK.replace(b"192.168.1.1", b"evil.example"), "not the gateway's address"),
    (SSDP_OK.replace(b"http://", b"file://"), "not http"),
    (SSDP_OK.replace(b"Location", b"X-Other"), "no LOCATION"),
    (b"HTTP/1.1 404 Not Found\r\n\r\n", "not 200"),
    (SSDP_OK + b"x" * 3000, "too long"),
    (b"\xff\xfe\x00junk", "not 200"),
    (SSDP_OK.replace(b"192.168.1.1:5000", b"192.168.1.1:99999"), "malformed"),
])
def test_junk_ssdp_answers_are_refused(data, why):
    with pytest.raises(PortMapError, match=why):
        igd.parse_ssdp(data, "192.168.1.1")


def test_description_prefers_wanipconnection_2():
    service = igd.find_service(DESCRIPTION, "http://192.168.1.1:5000/rootDesc.xml", "192.168.1.1")
    assert service == igd.Service("http://192.168.1.1:5000/ctl/IPConn",
                                  "urn:schemas-upnp-org:service:WANIPConnection:2")


@pytest.mark.parametrize("data, why", [
    (b"<root/>", "no WANIPConnection"),
    (b"<root><unclosed>", "not XML"),
    (b'<!DOCTYPE r [<!ENTITY a "aaaa">]><root>&a;</root>', "DTD or entities"),
    (b"<root>" + b"x" * igd.MAX_XML + b"</root>", "too long"),
    (DESCRIPTION.replace(b"/ctl/IPConn", b"http://10.0.0.9/ctl"), "away from the gateway"),
])
def test_junk_descriptions_are_refused(data, why):
    with pytest.raises(PortMapError, match=why):
        igd.find_service(data, "http://192.168.1.1:5000/rootDesc.xml", "192.168.1.1")


def test_soap_request_and_answers():
    service = igd.Service("http://192.168.1.1:5000/ctl", "urn:schemas-upnp-org:service:WANIPConnection:1")
    headers, body = igd.soap_request(service, "AddPortMapping", {"NewPortMappingDescription": "<a&b>",
                                                                 "NewExternalPort": 4001})
    assert headers["SOAPAction"] == '"urn:schemas-upnp-org:service:WANIPConnection:1#AddPortMapping"'
    assert b"<NewPortMappingDescription>&lt;a&amp;b&gt;</NewPortMappingDescription>" in body
    ok = (b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body><u:GetExternalIPAddressResponse'
          b' xmlns:u="x"><NewExternalIPAddress>11.99.0.101</NewExternalIPAddress></u:GetExternalIPAddressResponse>'
          b'</s:Body></s:Envelope>')
    assert igd.external_ip(igd.parse_soap(200, ok, "GetExternalIPAddress")) == "11.99.0.101"
    fault = (b'<s:Envelope xmlns:s="x"><s:Body><s:Fault><detail><UPnPError xmlns="urn:schemas-upnp-org:control-1-0">'
             b'<errorCode>718</errorCode><errorDescription>ConflictInMappingEntry</errorDescription></UPnPError>'
             b'</detail></s:Fault></s:Body></s:Envelope>')
    with pytest.raises(PortMapError, match="refused: 718 ConflictInMappingEntry"):
        igd.parse_soap(500, fault, "AddPortMapping")
    with pytest.raises(PortMapError, match="without a AddPortMappingResponse"):
        igd.parse_soap(200, b"<html/>", "AddPortMapping")
    with pytest.raises(PortMapError, match="no IPv4 address"):
        igd.external_ip({"NewExternalIPAddress": "not-an-ip"})


# ---- the gateway
ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
"""


def test_default_gateway_from_proc_net_route():
    assert default_gateway(ROUTES) == "192.168.1.1"
    assert default_gateway(ROUTES.splitlines()[0] + "\n" + ROUTES.splitlines()[1]) is None  # no default route
    assert default_gateway("header\njunk line\neth0 00000000 zz 0003\n") is None


# ---- fuzz: whatever a LAN device sends, only PortMapError comes out
def _only_portmap_errors(parse, data) -> None:
    try:
        parse(data)
    except PortMapError:
        pass


VALID = [natpmp.map_request(1, 2, 3), pcp_answer(), SSDP_OK, DESCRIPTION]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1200), st.sampled_from(VALID), st.integers(0, 1200), st.binary(max_size=8))
def test_fuzz_parsers_raise_only_portmap_errors(junk, valid, at, splice):
    mutated = valid[:at] + splice + valid[at + len(splice):]
    for data in (junk, mutated):
        _only_portmap_errors(natpmp.parse_map, data)
        _only_portmap_errors(natpmp.parse_external_address, data)
        _only_portmap_errors(lambda d: pcp.parse_map(d, NONCE), data)
        _only_portmap_errors(lambda d: igd.parse_ssdp(d, "192.168.1.1"), data)
        _only_portmap_errors(lambda d: igd.find_service(d, "http://192.168.1.1/", "192.168.1.1"), data)
        _only_portmap_errors(lambda d: igd.parse_soap(200, d, "AddPortMapping"), data)
