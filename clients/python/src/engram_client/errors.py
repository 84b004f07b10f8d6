"""Typed exceptions for gRPC failures.

Every call raises an :class:`EngramError` subclass chosen by the status code;
the original ``grpc.RpcError`` is chained as ``__cause__``.

The gateway phrases InvalidArgument as ``invalid argument <field>: <rule>``
(retrieval-svc/src/error.rs), and bad input found by a downstream service
comes through as ``<service>: <field>: <rule>``; :class:`InvalidArgument`
carries both parts.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

import grpc

__all__ = [
    "EngramError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "ResourceExhausted",
    "FailedPrecondition",
    "Unavailable",
    "DeadlineExceeded",
    "Internal",
    "parse_invalid_argument",
]

_SERVICES = ("search", "graph", "rerank", "retrieval")
_INVALID = re.compile(
    r"^(?:invalid argument |(?:%s): )?(?P<field>[A-Za-z_][A-Za-z0-9_.\[\]]*): (?P<rule>.+)$"
    % "|".join(_SERVICES),
    re.DOTALL,
)


def parse_invalid_argument(message: str) -> Tuple[Optional[str], str]:
    """``(field, rule)`` of an InvalidArgument message; field is None when
    the message names none (e.g. a value the database refused)."""
    m = _INVALID.match(message.strip())
    if m is None or m.group("field") in _SERVICES:
        return None, message
    return m.group("field"), m.group("rule")


class EngramError(Exception):
    """A failed call: ``code`` (grpc.StatusCode), ``message`` (the server's
    details) and ``metadata`` (trailing metadata as a dict)."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: Optional[grpc.StatusCode] = None,
                 metadata: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.metadata: Dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(EngramError, ValueError):
    """Bad input. ``field`` names it (e.g. ``text``, ``limit``,
    ``memories[0].content``) and ``rule`` says what it must satisfy."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.field, self.rule = parse_invalid_argument(message)


class Unauthenticated(EngramError):
    """Missing or unknown API key (or a bad JWT)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(EngramError):
    """E.g. writing above the key's trust level, or another tenant's id."""

    code = grpc.StatusCode.PERMISSION_DENIED


class NotFound(EngramError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(EngramError):
    """The tenant is over its rate or concurrency share; ``retry_after_ms``
    is the server's hint (None when it gave none)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    @property
    def retry_after_ms(self) -> Optional[int]:
        v = self.metadata.get("retry-after-ms")
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None


class FailedPrecondition(EngramError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(EngramError, ConnectionError):
    """The gateway (or everything behind it) could not be reached. Reads
    are retried on this before it is raised; writes never are."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(EngramError, TimeoutError):
    """The call's deadline passed (the client's, or the server's ceiling)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(EngramError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgument, Unauthenticated, PermissionDenied, NotFound, ResourceExhausted,
                FailedPrecondition, Unavailable, DeadlineExceeded, Internal)
}
# Client-side range errors have the same meaning as bad input.
_BY_CODE[grpc.StatusCode.OUT_OF_RANGE] = InvalidArgument


def _metadata(md: Any) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in md or ():
        k, v = item if isinstance(item, tuple) else (item.key, item.value)
        out[k] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out


def from_rpc_error(e: grpc.RpcError) -> EngramError:
    """The typed exception for a grpc (sync or aio) error."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else None) or str(code)
    try:
        md = _metadata(e.trailing_metadata()) if hasattr(e, "trailing_metadata") else {}
    except Exception:  # pragma: no cover - a call that never got trailers
        md = {}
    cls = _BY_CODE.get(code, EngramError)
    # The server's end of the call's own deadline (tonic answers CANCELLED
    # "Timeout expired" when the grpc-timeout the client sent runs out
    # first): the same event as the client's DEADLINE_EXCEEDED, so the
    # same exception, whichever side noticed first.
    if code == grpc.StatusCode.CANCELLED and details == "Timeout expired":
        cls = DeadlineExceeded
    return cls(details, code=code, metadata=md)
