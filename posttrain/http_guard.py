"""Refusing requests a web page in the user's browser could forge (both HTTP servers).

A page on any site can send a "simple" cross-site request to a server on loopback (a
POST of text/plain or form data, no custom headers, no preflight), and a DNS-rebinding
page can reach one under its own host name. ``foreign_request`` says when a request
looks like either: on a loopback server, a ``Host`` that does not name loopback; for a
write, a foreign ``Origin`` (or the opaque ``null`` of a sandboxed page or a file), or a
body that is not declared ``application/json`` or ``application/x-protobuf`` (which a
page can only send cross-site after a CORS preflight, which neither server answers).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

#: the names a loopback server answers to (a Host header with any other name is refused)
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
#: body types a write may declare: neither is one a page can send cross-site without a
#: CORS preflight (protobuf is what the tinker SDK sends for forward_backward)
WRITE_CONTENT_TYPES = frozenset({"application/json", "application/x-protobuf"})


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(netloc: str) -> str:
    """The host part of ``host[:port]`` or ``[v6]:port``, lower case, brackets removed."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def foreign_request(method: str, headers: Mapping[str, str], bound_host: str,
                    port: int) -> tuple[int, str] | None:
    """(HTTP status, message) when the request must be refused (module docstring), else
    None. ``bound_host``/``port``: the address the server listens on."""
    loopback = is_loopback(bound_host)
    host_header = (headers.get("Host") or "").strip()
    if loopback and host_header and host_name(host_header) not in LOOPBACK_NAMES:
        return 403, (f"Host {host_header!r} is not this server's address (a page under "
                     f"another name is not served): use http://127.0.0.1:{port}/")
    if method.upper() not in WRITE_METHODS:
        return None
    origin = (headers.get("Origin") or "").strip()
    if origin == "null":
        return 403, "writes from an opaque origin (a sandboxed page or a file) are refused"
    if origin:
        allowed = LOOPBACK_NAMES if loopback else {host_name(host_header)}
        parts = urlsplit(origin)
        if host_name(parts.netloc) not in allowed or parts.port not in (port, None):
            return 403, f"writes from another site ({origin}) are refused"
    kind = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind not in WRITE_CONTENT_TYPES:
        return 415, (f"a write must be sent as Content-Type: application/json, got "
                     f"{kind or 'none'!r}")
    return None
