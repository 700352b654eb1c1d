"""A container healthcheck: exit 0 when the web server at URL answers HTTP, 1 otherwise.

``python -m rigdash.healthcheck http://127.0.0.1:8000/login/`` (docker-compose.yml). Any status below 500 counts:
the process serves requests; a 400 for a Host outside RIGDASH_ALLOWED_HOSTS or the 301 of RIGDASH_SECURE=1 still
prove it. Redirects are not followed. /healthz is not used: a rig's backend being down is not the web's fault.
"""

from __future__ import annotations

import http.client
import sys
from urllib.parse import urlsplit


def answers(url: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False, f"not an http URL: {url}"
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    try:
        connection.request("GET", parts.path or "/", headers={"User-Agent": "rigdash-healthcheck"})
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{url}: {exc!r}"
    finally:
        connection.close()
    return status < 500, f"{url}: HTTP {status}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rigdash.healthcheck URL", file=sys.stderr)
        return 2
    ok, detail = answers(argv[0])
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
