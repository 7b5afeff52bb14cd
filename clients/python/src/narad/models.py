"""Typed answers of the Narad API.

Each dataclass mirrors one schema of the server's OpenAPI document (``GET /openapi.json``):
``SCHEMAS`` names the component schema, ``RESPONSE_SCHEMAS`` the operation whose answer has
an inline schema. A field is required (no default) exactly when the schema requires the
property, and ``Optional`` exactly when the property may be absent or ``null``. The tests
compare both against the live document, so a change in the API fails them.

Unknown properties in an answer are ignored, so a newer server does not break this client.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import (
    Any, Dict, List, Optional, Tuple, Type, TypeVar, Union, get_args, get_origin, get_type_hints,
)

T = TypeVar("T")


@dataclasses.dataclass
class Message:
    """A consumed or replayed message.

    ``payload`` is the message as the server returned it: a JSON value for JSON, ``str``
    for other text, and ``bytes`` when the server sent it base64 (``payload_encoding`` is then
    ``"base64"``; the client decodes it). ``receipt_handle`` is ``None`` on replays.
    """

    topic: str
    partition: int
    offset: int
    key: Optional[str]
    payload: Any
    delivery_count: int
    produced_at: str
    payload_encoding: Optional[str] = None
    receipt_handle: Optional[str] = None
    headers: Optional[Dict[str, str]] = None

    @property
    def body(self) -> bytes:
        """The payload as bytes: base64-decoded, UTF-8 text, or the JSON text."""
        if isinstance(self.payload, bytes):
            return self.payload
        if isinstance(self.payload, str):
            return self.payload.encode("utf-8")
        return json.dumps(self.payload, separators=(",", ":")).encode("utf-8")


@dataclasses.dataclass
class Produced:
    """Where a produce landed."""

    partition: int
    offset: int


@dataclasses.dataclass
class EntryResult:
    """One entry of a batch answer: ``status`` is what the single request would have got."""

    status: int
    partition: Optional[int] = None
    offset: Optional[int] = None
    error: Optional[Dict[str, str]] = None


@dataclasses.dataclass
class AckedMessages:
    """The answer of ``consume_acking``: new leases, and one result per handle acked."""

    messages: List[Message]
    acks: List[EntryResult]


@dataclasses.dataclass
class Settings:
    """A topic's settings (README, "Settings (per topic)")."""

    partitions: int
    visibility_timeout_ms: int
    max_in_flight_per_partition: int
    max_acked_ahead_per_partition: int
    retention_ms: int
    dedup_window_ms: int
    max_deliveries: int
    dead_letter_topic: Optional[str]
    paused: bool
    ordering: str


@dataclasses.dataclass
class Topic:
    name: str
    settings: Settings
    created_at: str


@dataclasses.dataclass
class PartitionStats:
    partition: int
    start_offset: int
    frontier: int
    next_offset: int
    available: int
    in_flight: int
    acked_ahead: int
    delayed: int
    segments: int
    bytes: int
    version: int
    manifest_bytes: int
    indexes: int
    oldest_unsettled_age_ms: Optional[int]
    oldest_available_age_ms: Optional[int]


@dataclasses.dataclass
class TopicInfo:
    """A topic with its per-partition figures (``GET /v1/topics/{topic}``)."""

    name: str
    settings: Settings
    created_at: str
    partitions: List[PartitionStats]

    @property
    def unsettled(self) -> int:
        """Messages not yet settled, in all partitions: available, in flight or delayed."""
        return sum(p.available + p.in_flight + p.delayed for p in self.partitions)


@dataclasses.dataclass
class TopicList:
    topics: List[Topic]
    next: Optional[str]


@dataclasses.dataclass
class SubscriptionPartition:
    partition: int
    frontier: int
    next_offset: int
    available: int
    in_flight: int
    acked_ahead: int
    delayed: int
    lost: int
    oldest_unsettled_age_ms: Optional[int]
    oldest_available_age_ms: Optional[int]


@dataclasses.dataclass
class Subscription:
    """A subscription: ``settings`` are its own, ``effective`` those its leases obey."""

    name: str
    topic: str
    start: str
    created_at: str
    settings: Dict[str, Any]
    effective: Dict[str, Any]
    partitions: Optional[List[SubscriptionPartition]] = None


@dataclasses.dataclass
class Purged:
    purged: int


@dataclasses.dataclass
class Redriven:
    moved: int
    failed: int


@dataclasses.dataclass
class Grant:
    """Topics (a name, or a prefix ending in ``*``) and the actions allowed on them."""

    topics: str
    actions: List[str]


@dataclasses.dataclass
class Whoami:
    user: str
    grants: List[Grant]


# Dataclass -> components.schemas name in the OpenAPI document.
SCHEMAS: Dict[type, str] = {
    Message: "Message",
    Produced: "Produced",
    EntryResult: "EntryResult",
    AckedMessages: "AckedMessages",
    Settings: "Settings",
    Topic: "Topic",
    TopicInfo: "TopicWithPartitions",
    PartitionStats: "PartitionStats",
    TopicList: "TopicList",
    Subscription: "Subscription",
    SubscriptionPartition: "SubscriptionPartition",
}

# Dataclass -> (operationId, status, JSON pointer inside that answer's schema) for answers
# whose schema is inline rather than a named component.
RESPONSE_SCHEMAS: Dict[type, Tuple[str, str, str]] = {
    Purged: ("purgeTopic", "200", ""),
    Redriven: ("redrive", "200", ""),
    Whoami: ("whoami", "200", ""),
    Grant: ("whoami", "200", "/properties/grants/items"),
}


def _unwrap_optional(tp: Any) -> Tuple[Any, bool]:
    if get_origin(tp) is Union:
        args = [a for a in get_args(tp) if a is not type(None)]
        optional = len(args) != len(get_args(tp))
        if len(args) == 1:
            return args[0], optional
        return Union[tuple(args)], optional  # pragma: no cover
    return tp, False


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp, _ = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value)
    origin = get_origin(tp)
    if origin in (list, List):
        (item,) = get_args(tp) or (Any,)
        return [_convert(item, v) for v in value]
    return value


def from_dict(cls: Type[T], data: Dict[str, Any]) -> T:
    """Builds dataclass ``cls`` from a JSON object, ignoring properties it does not know."""
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object for {cls.__name__}, got {type(data).__name__}")
    hints = get_type_hints(cls)
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    obj = cls(**kwargs)
    if isinstance(obj, Message) and obj.payload_encoding == "base64" and isinstance(obj.payload, str):
        obj.payload = base64.b64decode(obj.payload)
    return obj
