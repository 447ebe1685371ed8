"""Refusing requests a web page in the user's browser could forge (every HTTP server).

A page on any site can send a "simple" cross-site request to a server on loopback (a
POST of text/plain or form data, no custom headers, no preflight), and a DNS-rebinding
page can reach one under its own host name. ``foreign_request`` says when a request
looks like either: on a loopback server, a ``Host`` that does not name loopback; for a
write, a foreign ``Origin`` (or the opaque ``null`` of a sandboxed page or a file), or a
body that is not declared ``application/json`` or ``application/x-protobuf`` (which a
page can only send cross-site after a CORS preflight, which no posttrain server answers).
``foreign_socket`` says the same of a WebSocket's handshake, where any foreign ``Origin``
is refused (no preflight guards a WebSocket).
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


def foreign_origin(origin: str, host_header: str, loopback: bool, port: int,
                   what: str) -> tuple[int, str] | None:
    """(403, message) when ``origin`` (a browser's ``Origin`` header, empty when it sent
    none) is not this server's own: the opaque ``null`` or another site."""
    if origin == "null":
        return 403, f"{what} from an opaque origin (a sandboxed page or a file) are refused"
    if origin:
        allowed = LOOPBACK_NAMES if loopback else {host_name(host_header)}
        parts = urlsplit(origin)
        try:
            origin_port = parts.port
        except ValueError:  # a port that is not a number
            return 403, f"{what} from an origin that is not a URL ({origin[:80]!r}) are refused"
        if host_name(parts.netloc) not in allowed or origin_port not in (port, None):
            return 403, f"{what} from another site ({origin[:200]}) are refused"
    return None


def foreign_socket(headers: Mapping[str, str], bound_host: str,
                   port: int) -> tuple[int, str] | None:
    """(HTTP status, message) when a WebSocket's opening handshake must be refused: a
    ``Host`` as for any request, and any ``Origin`` but this server's own. A browser sends
    its page's origin with every WebSocket and no preflight guards one, so without this a
    page on any site could open a session on a server the user runs (a client that is
    not a browser sends no Origin: the tokens guard it)."""
    refusal = foreign_request("GET", headers, bound_host, port)
    if refusal is not None:
        return refusal
    return foreign_origin((headers.get("Origin") or "").strip(),
                          (headers.get("Host") or "").strip(), is_loopback(bound_host), port,
                          "WebSockets")


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
    refusal = foreign_origin(origin, host_header, loopback, port, "writes")
    if refusal is not None:
        return refusal
    kind = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind not in WRITE_CONTENT_TYPES:
        return 415, (f"a write must be sent as Content-Type: application/json, got "
                     f"{kind or 'none'!r}")
    return None
