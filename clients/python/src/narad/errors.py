"""Errors raised by the Narad client.

Every error the server answers is JSON, ``{"error": {"code": "...", "message": "..."}}``;
:class:`NaradError` carries the HTTP status and that code and message. Each status the API
documents has a subclass, so callers can ``except narad.Gone:`` for a lapsed lease.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Type


class NaradError(Exception):
    """An error answered by the server (or, with ``status`` 0, no answer at all)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after


class BadRequest(NaradError):
    """400: malformed request (bad name, setting, parameter, handle...)."""


class Unauthorized(NaradError):
    """401: missing or wrong credentials."""


class Forbidden(NaradError):
    """403: no grant for this action on this topic."""


class NotFound(NaradError):
    """404: no such topic, subscription, message or route."""


class RequestTimeout(NaradError):
    """408: the request body did not arrive in time."""


class Conflict(NaradError):
    """409: exists with other settings, or a quota is reached."""


class Gone(NaradError):
    """410: the lease is not yours any more (lapsed, settled, redelivered), or the offset expired.

    Not a bug to fix: the message may be processed twice; move on.
    """


class PayloadTooLarge(NaradError):
    """413: the message is larger than the server allows."""


class TooManyRequests(NaradError):
    """429: too many failed logins, or too many delayed runs; retry after ``retry_after``."""


class ServerError(NaradError):
    """500: a bug in the server (details in its log, by ``request_id``)."""


class Unavailable(NaradError):
    """503: retry after ``retry_after`` seconds (acked-ahead window full, busy, storage down...)."""


class ConnectionFailed(NaradError):
    """No HTTP answer: connection refused or reset, or a timeout. ``status`` is 0."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_failed", message)


_BY_STATUS: Dict[int, Type[NaradError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    408: RequestTimeout,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    429: TooManyRequests,
    500: ServerError,
    503: Unavailable,
}


def error_from_response(
    status: int,
    body: bytes,
    *,
    request_id: Optional[str] = None,
    retry_after: Optional[float] = None,
) -> NaradError:
    """Builds the error for a non-2xx answer from its JSON error body (or its raw text)."""
    code, message = "http_error", body.decode("utf-8", "replace").strip() or f"HTTP {status}"
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            code = str(err.get("code", code))
            message = str(err.get("message", message))
    except ValueError:
        pass
    cls = _BY_STATUS.get(status, NaradError)
    return cls(status, code, message, request_id=request_id, retry_after=retry_after)
