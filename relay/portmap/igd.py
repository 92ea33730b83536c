"""UPnP-IGD wire formats, sans-I/O: the SSDP M-SEARCH for a WANIPConnection service, parsing its
answer (the ``LOCATION`` of the device description), finding the WANIPConnection:2/1 (or
WANPPPConnection:1) control URL in the description, and the SOAP requests AddPortMapping,
DeletePortMapping and GetExternalIPAddress with their answers. Every answer is size-capped by the
caller and parsed here with no DTDs or entities (a document declaring any is refused), so a
hostile LAN device's junk ends in a PortMapError."""
from __future__ import annotations

import ipaddress
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit
from xml.sax.saxutils import escape

from .errors import PortMapError

SSDP_ADDR, SSDP_PORT = "239.255.255.250", 1900
MAX_SSDP = 2048
MAX_XML = 64 * 1024
SERVICES = ("urn:schemas-upnp-org:service:WANIPConnection:2", "urn:schemas-upnp-org:service:WANIPConnection:1",
            "urn:schemas-upnp-org:service:WANPPPConnection:1")
SEARCH_TARGET = "urn:schemas-upnp-org:device:InternetGatewayDevice:1"
SOAP_ENV = "http://schemas.xmlsoap.org/soap/envelope/"


@dataclass(frozen=True)
class Service:
    control_url: str
    service_type: str


def m_search(target: str = SEARCH_TARGET) -> bytes:
    return (f"M-SEARCH * HTTP/1.1\r\nHOST: {SSDP_ADDR}:{SSDP_PORT}\r\nMAN: \"ssdp:discover\"\r\nMX: 1\r\n"
            f"ST: {target}\r\n\r\n").encode()


def parse_ssdp(data: bytes, gateway: str) -> str:
    """The description URL an SSDP answer names; it must be http:// on ``gateway`` itself."""
    if len(data) > MAX_SSDP:
        raise PortMapError(f"SSDP answer too long ({len(data)} bytes)")
    lines = data.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 200"):
        raise PortMapError(f"SSDP answer is not 200 OK: {lines[0][:60]!r}")
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "location":
            return checked_url(value.strip(), gateway)
    raise PortMapError("SSDP answer has no LOCATION")


def checked_url(url: str, gateway: str) -> str:
    """``url`` if it is http:// on the gateway's own address (never elsewhere), else PortMapError."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError:
        raise PortMapError(f"UPnP URL is malformed: {url[:80]!r}") from None
    if parts.scheme != "http" or host is None:
        raise PortMapError(f"UPnP URL is not http: {url[:80]!r}")
    try:
        if ipaddress.ip_address(host) != ipaddress.ip_address(gateway):
            raise PortMapError(f"UPnP URL points away from the gateway {gateway}: {url[:80]!r}")
    except ValueError:
        raise PortMapError(f"UPnP URL host is not the gateway's address: {url[:80]!r}") from None
    return url


def _xml(data: bytes) -> ET.Element:
    if len(data) > MAX_XML:
        raise PortMapError(f"UPnP document too long ({len(data)} bytes)")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise PortMapError("UPnP document declares a DTD or entities")
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise PortMapError(f"UPnP document is not XML: {exc}") from None


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def find_service(description: bytes, location: str, gateway: str) -> Service:
    """The best WAN connection service of a device description fetched from ``location``."""
    root = _xml(description)
    base = location
    found: dict[str, str] = {}
    for element in root.iter():
        name = _local(element.tag)
        if name == "URLBase" and element.text:
            base = element.text.strip()
        elif name == "service":
            fields = {_local(child.tag): (child.text or "").strip() for child in element}
            if fields.get("serviceType") in SERVICES and fields.get("controlURL"):
                found.setdefault(fields["serviceType"], fields["controlURL"])
    for service_type in SERVICES:
        if service_type in found:
            return Service(checked_url(urljoin(base, found[service_type]), gateway), service_type)
    raise PortMapError("the UPnP device offers no WANIPConnection service")


def soap_request(service: Service, action: str, args: dict[str, str | int]) -> tuple[dict[str, str], bytes]:
    """The headers and body of a SOAP call of ``action`` with ``args`` (in order)."""
    fields = "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in args.items())
    body = (f'<?xml version="1.0"?>\r\n<s:Envelope xmlns:s="{SOAP_ENV}" '
            f's:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/"><s:Body>'
            f'<u:{action} xmlns:u="{service.service_type}">{fields}</u:{action}></s:Body></s:Envelope>\r\n')
    headers = {"Content-Type": 'text/xml; charset="utf-8"', "SOAPAction": f'"{service.service_type}#{action}"'}
    return headers, body.encode()


def parse_soap(status: int, data: bytes, action: str) -> dict[str, str]:
    """The out-arguments of a SOAP answer to ``action``; a UPnP fault raises with its code."""
    root = _xml(data)
    for element in root.iter():
        if _local(element.tag) == "UPnPError":
            fields = {_local(child.tag): (child.text or "").strip()[:120] for child in element}
            raise PortMapError(f"UPnP {action} refused: {fields.get('errorCode', '?')} "
                               f"{fields.get('errorDescription', '')}".rstrip())
        if _local(element.tag) == f"{action}Response":
            if status != 200:
                raise PortMapError(f"UPnP {action}: HTTP {status}")
            return {_local(child.tag): (child.text or "").strip() for child in element}
    raise PortMapError(f"UPnP {action}: HTTP {status} without a {action}Response")


def external_ip(values: dict[str, str]) -> str:
    try:
        address = ipaddress.IPv4Address(values.get("NewExternalIPAddress", ""))
    except ValueError:
        raise PortMapError("UPnP GetExternalIPAddress gave no IPv4 address") from None
    if address.is_unspecified:
        raise PortMapError("UPnP router has no external address yet")
    return str(address)
