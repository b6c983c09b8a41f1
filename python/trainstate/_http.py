"""Requests to the head's HTTP API, each with a deadline, standard library only.

Paths come from the route table (:mod:`trainstate._contract`), and whether
a failed request may be retried is decided as the Rust client decides it:
by the error code (``RETRYABLE_ERROR_CODES``, Rust's
``ErrorCode::is_retryable``), and a request that got no answer at all
(:class:`Unreachable`) may always be retried.
"""

import functools
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Mapping, Optional, Union

from ._contract import ERROR_STATUS, RETRYABLE_ERROR_CODES, Route
from .types import ErrorCode

_CODES: Dict[str, ErrorCode] = {code: code for code in ERROR_STATUS}


def error_code(status: int, code: Optional[str]) -> ErrorCode:
    """The error code of an error answer, read as the Rust client reads it:
    the body's ``code`` when it is one of the API's; otherwise (a proxy's
    page, another server, a code this client does not know)
    ``no_such_route`` for a 404, ``unavailable`` for a server error, and
    ``internal`` for anything else."""
    known = _CODES.get(code) if code is not None else None
    if known is not None:
        return known
    if status == 404:
        return "no_such_route"
    if 500 <= status <= 599:
        return "unavailable"
    return "internal"


class HeadError(Exception):
    """The head answered with an error: ``status``, the error's ``code``
    (see :func:`error_code`), and the error body's ``message`` and ``field``."""

    def __init__(self, status: int, code: ErrorCode, message: str, field: Optional[str] = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code: ErrorCode = code
        self.message = message
        self.field = field

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later: the head was
        unavailable, busy or slow, or the request's body stalled on the way
        (``RETRYABLE_ERROR_CODES``), not the request wrong."""
        return self.code in RETRYABLE_ERROR_CODES


class Unreachable(Exception):
    """No answer: the head is down, unreachable, or slower than the deadline.
    Always worth retrying, as a transport failure is for the Rust client."""


def url_path(route: Route, **params: Union[str, int]) -> str:
    """The path of ``route`` with each ``{name}`` of its template replaced by
    ``params[name]``, escaped as one path segment."""
    filled = route.path
    for name, value in params.items():
        placeholder = "{" + name + "}"
        if placeholder not in filled:
            raise ValueError(f"{route.path} has no parameter {name!r}")
        filled = filled.replace(placeholder, urllib.parse.quote(str(value), safe=":"))
    if "{" in filled:
        raise ValueError(f"{route.path}: a parameter is missing ({filled})")
    return filled


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
    route: Route,
    path: str,
    body: Optional[Mapping[str, Any]],
    token: Optional[str],
    timeout: float,
    ca_cert: Optional[str] = None,
) -> Dict[str, Any]:
    """Sends one request of ``route`` to ``path`` (the route's template,
    filled by :func:`url_path`) and returns the JSON answer. Raises ``HeadError``
    for an error answer and ``Unreachable`` when there is no answer. An
    ``https://`` head is trusted through :func:`tls_context` of ``ca_cert``."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=route.method)
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
        code: Optional[str] = None
        message = err.reason if isinstance(err.reason, str) else str(err)
        field: Optional[str] = None
        try:
            error = json.loads(raw.decode("utf-8"))["error"]
            if isinstance(error.get("code"), str):
                code = error["code"]
                message = str(error.get("message", ""))
                field = error["field"] if isinstance(error.get("field"), str) else None
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise HeadError(err.code, error_code(err.code, code), message, field) from None
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
