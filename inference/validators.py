"""A rig's backend URL: http(s), a host and an optional port, on any network a rig lives on.

Django's URLValidator wants a public domain name, so it refuses what container networks and LANs use: a
compose service (``http://ollama:11434``), a single-label or ``.lan`` host, an IPv6 literal (``http://[::1]:8081``).
Here the host must be a syntactically valid name or IP address; whether it resolves is the health check's business.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

# RFC 1123 labels; underscores too, which Docker service and container names may carry.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
SCHEMES = ("http", "https")


def _host_ok(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.ip_address(host[1:-1]).version == 6
        except ValueError:
            return False
    if len(host) > 253:
        return False
    return all(_LABEL.match(label) for label in host.removesuffix(".").split("."))


def validate_backend_url(value: str) -> None:
    """Raise ValidationError unless ``value`` is http(s)://host[:port][/path] with nothing else."""
    if not isinstance(value, str) or value != value.strip() or any(ch.isspace() for ch in value):
        raise ValidationError("Enter a URL without spaces, like http://ollama:11434.", code="invalid")
    try:
        parts = urlsplit(value)
    except ValueError:  # a bracketed host that is not an IPv6 address
        raise ValidationError("Enter a valid URL, like http://ollama:11434.", code="invalid") from None
    if parts.scheme not in SCHEMES:
        raise ValidationError("The URL must start with http:// or https://.", code="invalid")
    host = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        raise ValidationError("Leave credentials out of the URL (it is shown on status pages).", code="invalid")
    if parts.query or parts.fragment:
        raise ValidationError("A backend URL has no query string or fragment.", code="invalid")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or host.endswith(":"):
        raise ValidationError("The port must be a number from 1 to 65535.", code="invalid")
    hostname = host.rsplit(":", 1)[0] if port is not None else host
    if not hostname or not _host_ok(hostname):
        raise ValidationError(
            "Enter a host name (ollama, gpu-box.lan), an IPv4 address or a bracketed IPv6 address.", code="invalid"
        )


def validate_backend_key(value: str) -> None:
    """A backend key travels in an HTTP header: printable ASCII without spaces, as llama-server's keys are."""
    if value and not all(33 <= ord(char) <= 126 for char in value):
        raise ValidationError("A backend key is printable ASCII without spaces.", code="invalid")
