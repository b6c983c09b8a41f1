"""Requests to the head's HTTP API, each with a deadline, standard library only."""

import functools
import json
import socket
import ssl
import urllib.error
import urllib.request
from typing import Any, Dict, Optional


class HeadError(Exception):
    """The head answered with an error: ``status``, and the error body's
    ``code``, ``message`` and ``field``."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later (503, or 408: the body stalled)."""
        return self.status in (503, 408) or self.status >= 500 and self.code in ("", "unavailable")


class Unreachable(Exception):
    """No answer: the head is down, unreachable, or slower than the deadline."""


@functools.lru_cache(maxsize=4)
def tls_context(ca_cert: Optional[str]) -> ssl.SSLContext:
    """The TLS context of an ``https://`` head: the CAs in the PEM file
    ``ca_cert`` *instead of* the system's roots (as ``curl --cacert``), or
    the system's roots without one. Raises ``ValueError`` naming
    ``TRAINSTATE_CA_CERT`` for a file it cannot use."""
    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (OSError, ssl.SSLError) as err:
        raise ValueError(f"TRAINSTATE_CA_CERT={ca_cert}: not a readable PEM file of CA certificates ({err})") from None


def request(
    base: str,
    method: str,
    path: str,
    body: Optional[Any],
    token: Optional[str],
    timeout: float,
    ca_cert: Optional[str] = None,
) -> Dict[str, Any]:
    """Sends one request and returns the JSON answer. Raises ``HeadError``
    for an error answer and ``Unreachable`` when there is no answer. An
    ``https://`` head is trusted through :func:`tls_context` of ``ca_cert``."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        context = tls_context(ca_cert) if base.startswith("https://") else None
        with urllib.request.urlopen(req, timeout=timeout, context=context) as response:
            raw = response.read()
    except urllib.error.HTTPError as err:
        raw = b""
        try:
            raw = err.read()
        except OSError:
            pass
        code, message, field = "", err.reason if isinstance(err.reason, str) else str(err), None
        try:
            error = json.loads(raw.decode("utf-8"))["error"]
            code, message, field = error.get("code", ""), error.get("message", ""), error.get("field")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise HeadError(err.code, code, message, field) from None
    except (urllib.error.URLError, socket.timeout, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise Unreachable(
                f"{base}: the head's TLS certificate is not trusted ({reason.verify_message}); "
                "trust the CA that signed it with TRAINSTATE_CA_CERT"
            ) from None
        raise Unreachable(f"{base}: {reason}") from None
    try:
        answer = json.loads(raw.decode("utf-8")) if raw else {}
    except ValueError:
        raise Unreachable(f"{base}: the answer is not JSON: is this a trainstate head?") from None
    if not isinstance(answer, dict):
        raise Unreachable(f"{base}: the answer is not a JSON object")
    return answer
