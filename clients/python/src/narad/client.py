"""A synchronous Narad client on the standard library's ``urllib``."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import email.utils
import http.client
import json
import logging
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from .errors import ConnectionFailed, NaradError, error_from_response
from .models import (
    AckedMessages,
    EntryResult,
    Message,
    Produced,
    Redriven,
    Subscription,
    Topic,
    TopicInfo,
    TopicList,
    Whoami,
    from_dict,
)
from .operations import OPERATIONS, PARAMETERS

log = logging.getLogger("narad")

T = TypeVar("T")

#: A duration: seconds (``int``/``float``), a ``timedelta``, or the API's own syntax (``"30s"``,
#: ``"500ms"``, ``"5m"``).
Duration = Union[int, float, datetime.timedelta, str]

#: A lease to settle: a consumed :class:`Message`, or a receipt handle string (then ``topic``
#: must be given too).
Lease = Union[Message, str]

#: Retried statuses: 503 (unavailable: acked-ahead window full, busy, storage) and 429.
RETRY_STATUSES = frozenset({429, 503})


@dataclasses.dataclass
class RetryPolicy:
    """How the client retries 503, 429 and connection failures.

    Attempt ``n`` (from 1) waits ``Retry-After`` when the server sent one, else a jittered
    exponential backoff, ``uniform(b/2, b)`` with ``b = min(max_delay, base_delay * 2**(n-1))``,
    whichever is longer. It gives up after ``max_attempts`` attempts or once the next wait
    would pass ``max_elapsed`` seconds since the first, and raises the last error.

    Only requests that are safe to repeat are retried: reads, acks, extends and nacks (a handle
    settles once), admin calls, and produces that carry an idempotency key. A produce without
    one raises at once, since it may have been stored.
    """

    max_attempts: int = 10
    max_elapsed: float = 60.0
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int, retry_after: Optional[float]) -> float:
        backoff = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        jittered = random.uniform(backoff / 2, backoff)
        if retry_after is None:
            return jittered
        # The server's figure, plus a little jitter so that many clients do not come back at
        # the same instant; the growing backoff wins once it is longer.
        return max(retry_after + random.uniform(0, min(1.0, backoff / 2)), jittered)


NO_RETRY = RetryPolicy(max_attempts=1)


def duration(value: Duration) -> str:
    """Renders a duration in the API's syntax: ``30`` -> ``"30s"``, ``0.5`` -> ``"500ms"``."""
    if isinstance(value, str):
        return value
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool):
        raise TypeError("a duration cannot be a bool")
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)}s"
    return f"{int(round(value * 1000))}ms"


def duration_seconds(value: Optional[Duration]) -> float:
    """The number of seconds in a duration (``"10s"`` -> 10.0, ``"500ms"`` -> 0.5)."""
    if value is None:
        return 0.0
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        return float(value)
    s = value.strip()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if s.endswith(suffix) and s[: -len(suffix)].strip().isdigit():
            return int(s[: -len(suffix)]) * factor
    return float(s)


def _extend_value(extend: Union[bool, Duration]) -> str:
    if extend is True:
        return "true"
    if extend is False:
        raise ValueError("extend=False means nothing; use ack() to settle")
    if isinstance(extend, (int, float)) and extend == 0:
        return "0"
    return duration(extend)


def _encode_body(body: Any) -> bytes:
    """bytes as they are, str as UTF-8 text, anything else as its JSON text."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


@dataclasses.dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Client:
    """A Narad client. Thread-safe: every call opens its own connection.

    >>> c = Client("http://127.0.0.1:8080", "me", "secret")
    >>> c.produce("orders", {"id": 1})
    Produced(partition=0, offset=0)
    """

    def __init__(
        self,
        base_url: str,
        user: Optional[str] = None,
        password: Optional[str] = None,
        timeout: float = 30.0,
        retry: Optional[RetryPolicy] = None,
        user_agent: str = "narad-python/0.1",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self._headers: Dict[str, str] = {"User-Agent": user_agent}
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode("utf-8")).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._opener = urllib.request.build_opener()

    # ----------------------------------------------------------------- transport

    def url(self, operation: str, query: Optional[Mapping[str, Any]] = None, **path: Any) -> str:
        """The URL of ``operation`` (an operationId of OPERATIONS) with its path parameters."""
        _, template = OPERATIONS[operation]
        quoted = {k: urllib.parse.quote(str(v), safe="") for k, v in path.items()}
        url = self.base_url + template.format(**quoted)
        params = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        unknown = set(params) - PARAMETERS.get(operation, frozenset())
        if unknown:
            raise ValueError(f"{operation} has no query parameter {sorted(unknown)}")
        if params:
            url += "?" + urllib.parse.urlencode(params)
        return url

    def request(
        self,
        operation: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        retry: bool = True,
        timeout: Optional[float] = None,
        **path: Any,
    ) -> Response:
        """Sends one API operation and returns its 2xx answer; raises :class:`NaradError`.

        With ``retry``, 503, 429 and connection failures are retried under ``self.retry``.
        """
        method, _ = OPERATIONS[operation]
        url = self.url(operation, query, **path)
        for name in headers or {}:
            if name == "Idempotency-Key" and name not in PARAMETERS.get(operation, frozenset()):
                raise ValueError(f"{operation} has no header parameter {name}")
        hdrs = dict(self._headers)
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        hdrs.update(headers or {})
        policy = self.retry if retry else NO_RETRY
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._send(method, url, body, hdrs, timeout or self.timeout)
            except NaradError as err:
                retryable = isinstance(err, ConnectionFailed) or err.status in RETRY_STATUSES
                if not retryable or attempt >= policy.max_attempts:
                    raise
                pause = policy.delay(attempt, err.retry_after)
                if time.monotonic() - started + pause > policy.max_elapsed:
                    raise
                log.info(
                    "narad: %s %s answered %s %s; retry %d in %.2fs",
                    method, operation, err.status, err.code, attempt, pause,
                )
                time.sleep(pause)

    def _send(
        self, method: str, url: str, body: Optional[bytes], headers: Dict[str, str], timeout: float
    ) -> Response:
        req = urllib.request.Request(url, data=body, headers=headers, method=method)
        if body is None and method in ("POST", "PUT", "PATCH"):
            req.data = b""
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                return Response(resp.status, resp.headers, resp.read())
        except urllib.error.HTTPError as e:
            data = e.read()
            raise error_from_response(
                e.code,
                data,
                request_id=e.headers.get("X-Request-Id"),
                retry_after=_retry_after(e.headers.get("Retry-After")),
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ConnectionFailed(f"{method} {url}: {reason}") from e

    def _json(self, cls: Callable[..., T], resp: Response) -> T:
        return from_dict(cls, resp.json())  # type: ignore[arg-type]

    # ----------------------------------------------------------------- produce

    def produce(
        self,
        topic: str,
        body: Any,
        *,
        key: Optional[str] = None,
        partition: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        delay: Optional[Duration] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Produced:
        """Appends one message (``POST /v1/topics/{topic}/produce``).

        ``body``: ``bytes`` are sent as they are, a ``str`` as UTF-8 text, anything else as
        its JSON text. (The server embeds bodies that parse as JSON verbatim on consume, turns
        other text into a JSON string, and base64s the rest.) ``headers`` become
        ``Narad-Header-<name>``. Retried on 503/429 only with an ``idempotency_key``.
        """
        hdrs = {"Content-Type": "application/octet-stream"}
        for name, value in (headers or {}).items():
            hdrs[f"Narad-Header-{name}"] = value
        if idempotency_key is not None:
            hdrs["Idempotency-Key"] = idempotency_key
        query = {
            "key": key,
            "partition": partition,
            "delay": duration(delay) if delay is not None else None,
        }
        resp = self.request(
            "produce",
            topic=topic,
            query=query,
            body=_encode_body(body),
            headers=hdrs,
            retry=idempotency_key is not None,
        )
        return self._json(Produced, resp)

    def produce_batch(
        self, topic: str, messages: Iterable[Union[Mapping[str, Any], Any]]
    ) -> List[EntryResult]:
        """Appends many messages in one request (``produce-batch``); one result per message.

        Each message is a mapping with ``payload`` and optionally ``key``, ``partition``,
        ``idempotency_key``, ``headers`` and ``delay`` (a duration) or ``delay_ms``; anything
        else is taken as a payload. A ``bytes`` payload is sent base64; any other payload is a
        JSON value, stored as its JSON text. Retried on 503/429 only when every message carries
        an idempotency key. Check each result's ``status`` (201, or the error a single produce
        would have got).
        """
        entries: List[Dict[str, Any]] = []
        for m in messages:
            spec: Dict[str, Any] = dict(m) if isinstance(m, Mapping) else {"payload": m}
            if "delay" in spec:
                d = spec.pop("delay")
                if d is not None:
                    spec["delay_ms"] = int(round(duration_seconds(d) * 1000))
            payload = spec.get("payload")
            if isinstance(payload, (bytes, bytearray, memoryview)):
                spec["payload"] = base64.b64encode(bytes(payload)).decode("ascii")
                spec["payload_encoding"] = "base64"
            entries.append({k: v for k, v in spec.items() if v is not None})
        all_keyed = bool(entries) and all("idempotency_key" in e for e in entries)
        resp = self.request(
            "produceBatch",
            topic=topic,
            body=json.dumps({"messages": entries}).encode("utf-8"),
            retry=all_keyed,
        )
        return [from_dict(EntryResult, r) for r in resp.json()["results"]]

    # ----------------------------------------------------------------- consume

    @overload
    def consume(
        self,
        topic: str,
        max: None = None,
        *,
        wait: Optional[Duration] = None,
        subscription: Optional[str] = None,
        partition: Optional[int] = None,
    ) -> Optional[Message]: ...

    @overload
    def consume(
        self,
        topic: str,
        max: int,
        *,
        wait: Optional[Duration] = None,
        subscription: Optional[str] = None,
        partition: Optional[int] = None,
    ) -> List[Message]: ...

    def consume(
        self,
        topic: str,
        max: Optional[int] = None,
        *,
        wait: Optional[Duration] = None,
        subscription: Optional[str] = None,
        partition: Optional[int] = None,
    ) -> Union[Optional[Message], List[Message]]:
        """Leases a message: one (or ``None``), or with ``max`` a list of up to ``max``.

        ``wait`` long-polls (capped by the server, 10 s by default). Each message must be
        acked, extended or nacked before its topic's ``visibility_timeout_ms`` runs out.
        """
        query = _lease_query(wait, max, subscription, partition)
        resp = self.request(
            "consume",
            topic=topic,
            query=query,
            timeout=self.timeout + duration_seconds(wait),
        )
        if resp.status == 204:
            return [] if max is not None else None
        doc = resp.json()
        if max is None:
            return from_dict(Message, doc)
        return [from_dict(Message, m) for m in doc["messages"]]

    def consume_acking(
        self,
        topic: str,
        ack: Sequence[Lease] = (),
        *,
        max: Optional[int] = None,
        wait: Optional[Duration] = None,
        subscription: Optional[str] = None,
        partition: Optional[int] = None,
    ) -> AckedMessages:
        """Acks ``ack`` and leases the next message(s) in one request (``POST consume``).

        The acks' results come back in ``acks``: 204 acked, 410 gone, 503 unknown (ack again).
        """
        handles = [_handle(topic, h)[1] for h in ack]
        query = _lease_query(wait, max, subscription, partition)
        resp = self.request(
            "consumeAcking",
            topic=topic,
            query=query,
            body=json.dumps({"ack": handles}).encode("utf-8"),
            timeout=self.timeout + duration_seconds(wait),
        )
        return self._json(AckedMessages, resp)

    def replay(self, topic: str, partition: int, offset: int) -> Message:
        """Reads one retained message by position, read-only (no lease, no receipt handle)."""
        resp = self.request(
            "consume", topic=topic, query={"partition": partition, "offset": offset}
        )
        return self._json(Message, resp)

    # ----------------------------------------------------------------- settle

    def _settle(self, target: Lease, receipt_handle: Optional[str], extend: Optional[str]) -> None:
        topic, handle = _lease(target, receipt_handle)
        self.request("ack", topic=topic, query={"receipt_handle": handle, "extend": extend})

    def ack(self, target: Lease, receipt_handle: Optional[str] = None) -> None:
        """Settles a lease: ``ack(message)`` or ``ack(topic, receipt_handle)``.

        Retried on 503 (acked-ahead window full) and 429. Raises :class:`Gone` (410) when
        the lease is not yours any more: the message may be processed twice; move on.
        """
        self._settle(target, receipt_handle, None)

    def extend(self, target: Lease, receipt_handle: Optional[str] = None) -> None:
        """Renews the lease for the visibility timeout, from now (a heartbeat)."""
        self._settle(target, receipt_handle, "true")

    def nack(self, target: Lease, receipt_handle: Optional[str] = None) -> None:
        """Gives the message back at once: it is delivered again (``extend=0``)."""
        self._settle(target, receipt_handle, "0")

    def retry_later(
        self, target: Lease, receipt_handle: Optional[str] = None, *, after: Duration
    ) -> None:
        """Ends the lease ``after`` from now, so the message comes back then (``extend=30s``)."""
        self._settle(target, receipt_handle, duration(after))

    def settle_batch(
        self,
        topic: str,
        leases: Sequence[Lease],
        extend: Union[None, bool, Duration] = None,
    ) -> List[EntryResult]:
        """Acks (or with ``extend`` extends, nacks, retries later) many handles at once.

        One result per handle, in order: 204, or 410 (gone: move on). Entries answered 503
        are sent again, alone, under the retry policy; a 503 left in the results means the
        policy ran out.
        """
        handles = [_handle(topic, h)[1] for h in leases]
        results: List[Optional[EntryResult]] = [None] * len(handles)
        pending = list(range(len(handles)))
        started = time.monotonic()
        attempt = 0
        while pending:
            attempt += 1
            body: Dict[str, Any] = {"receipt_handles": [handles[i] for i in pending]}
            if extend is not None:
                value = _extend_value(extend)  # validated; JSON true and 0 sent as such
                body["extend"] = True if value == "true" else 0 if value == "0" else value
            resp = self.request("ack", topic=topic, body=json.dumps(body).encode("utf-8"))
            answers = [from_dict(EntryResult, r) for r in resp.json()["results"]]
            retry_next: List[int] = []
            for i, res in zip(pending, answers):
                results[i] = res
                if res.status in RETRY_STATUSES:
                    retry_next.append(i)
            pending = retry_next
            if pending:
                pause = self.retry.delay(attempt, 1.0)
                if (
                    attempt >= self.retry.max_attempts
                    or time.monotonic() - started + pause > self.retry.max_elapsed
                ):
                    break
                log.info("narad: %d batch settles answered 503; retry in %.2fs", len(pending), pause)
                time.sleep(pause)
        return [r for r in results if r is not None]

    def cancel_message(
        self, topic: str, partition: int, offset: int, *, subscription: Optional[str] = None
    ) -> None:
        """Cancels one retained message, for every subscription or for ``subscription``."""
        self.request(
            "cancelMessage",
            topic=topic,
            partition=partition,
            offset=offset,
            query={"subscription": subscription},
        )

    # ----------------------------------------------------------------- topics

    def create_topic(self, topic: str, **settings: Any) -> Topic:
        """Creates a topic (201), or finds it with the same settings (200); 409 if it differs.

        Settings are keyword arguments: ``partitions``, ``visibility_timeout_ms``, ...
        """
        body = json.dumps(settings).encode("utf-8") if settings else None
        return self._json(Topic, self.request("createTopic", topic=topic, body=body))

    def get_topic(self, topic: str) -> TopicInfo:
        """A topic's settings and per-partition figures."""
        return self._json(TopicInfo, self.request("getTopic", topic=topic))

    def patch_topic(self, topic: str, **settings: Any) -> Topic:
        """Changes settings (``dead_letter_topic=""`` clears it)."""
        body = json.dumps(settings).encode("utf-8")
        return self._json(Topic, self.request("changeTopic", topic=topic, body=body))

    change_topic = patch_topic

    def delete_topic(self, topic: str) -> None:
        self.request("deleteTopic", topic=topic)

    def list_topics(self, limit: Optional[int] = None, after: Optional[str] = None) -> TopicList:
        """One page of topics (those the caller holds a grant on); ``next`` continues it."""
        resp = self.request("listTopics", query={"limit": limit, "after": after})
        return self._json(TopicList, resp)

    def iter_topics(self, page_size: Optional[int] = None) -> Iterator[Topic]:
        """Every topic, page after page."""
        after: Optional[str] = None
        while True:
            page = self.list_topics(limit=page_size, after=after)
            yield from page.topics
            if page.next is None:
                return
            after = page.next

    def purge(self, topic: str, *, subscription: Optional[str] = None) -> int:
        """Removes every retained message (or settles them all for ``subscription``)."""
        resp = self.request("purgeTopic", topic=topic, query={"subscription": subscription})
        return int(resp.json()["purged"])

    def redrive(self, topic: str, *, max: Optional[int] = None) -> Redriven:
        """Moves up to ``max`` dead letters of this dead-letter topic back to their source."""
        return self._json(Redriven, self.request("redrive", topic=topic, query={"max": max}))

    # ----------------------------------------------------------------- subscriptions

    def create_subscription(self, topic: str, name: str, **settings: Any) -> Subscription:
        """Creates a subscription (``start="earliest"`` for every retained message)."""
        body = json.dumps(settings).encode("utf-8") if settings else None
        resp = self.request("createSubscription", topic=topic, subscription=name, body=body)
        return self._json(Subscription, resp)

    def get_subscription(self, topic: str, name: str) -> Subscription:
        resp = self.request("getSubscription", topic=topic, subscription=name)
        return self._json(Subscription, resp)

    def patch_subscription(self, topic: str, name: str, **settings: Any) -> Subscription:
        body = json.dumps(settings).encode("utf-8")
        resp = self.request("patchSubscription", topic=topic, subscription=name, body=body)
        return self._json(Subscription, resp)

    def delete_subscription(self, topic: str, name: str) -> None:
        self.request("deleteSubscription", topic=topic, subscription=name)

    def list_subscriptions(self, topic: str) -> List[Subscription]:
        resp = self.request("listSubscriptions", topic=topic)
        return [from_dict(Subscription, s) for s in resp.json()["subscriptions"]]

    # ----------------------------------------------------------------- the caller

    def whoami(self) -> Whoami:
        """The authenticated user and its grants (``GET /v1/whoami``)."""
        return self._json(Whoami, self.request("whoami"))

    def visibility_timeout(self, topic: str, subscription: Optional[str] = None) -> float:
        """The lease length, in seconds, that consumes of ``topic`` (``subscription``) get."""
        if subscription is not None:
            sub = self.get_subscription(topic, subscription)
            return int(sub.effective["visibility_timeout_ms"]) / 1000.0
        return self.get_topic(topic).settings.visibility_timeout_ms / 1000.0


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _lease(target: Lease, receipt_handle: Optional[str]) -> Tuple[str, str]:
    if isinstance(target, Message):
        if target.receipt_handle is None:
            raise ValueError("this message has no receipt handle (a replay?)")
        return target.topic, target.receipt_handle
    if receipt_handle is None:
        raise TypeError("give a Message, or a topic and a receipt handle")
    return target, receipt_handle


def _handle(topic: str, lease: Lease) -> Tuple[str, str]:
    if isinstance(lease, Message):
        if lease.topic != topic:
            raise ValueError(f"message of topic {lease.topic!r}, not {topic!r}")
        return _lease(lease, None)
    return topic, lease


__all__ = [
    "Client",
    "RetryPolicy",
    "NO_RETRY",
    "Duration",
    "Lease",
    "duration",
]


def _lease_query(
    wait: Optional[Duration], max: Optional[int], subscription: Optional[str], partition: Optional[int]
) -> Dict[str, Any]:
    """The query of a consume that leases (``GET`` or ``POST``): ``None`` values are left out."""
    return {
        "wait": duration(wait) if wait is not None else None,
        "max": max,
        "subscription": subscription,
        "partition": partition,
    }
