"""Narad: a Python client for the Narad pull-based HTTP message broker.

>>> import narad
>>> client = narad.Client("http://127.0.0.1:8080", "me", "secret")
>>> client.produce("orders", {"id": 1})
>>> msg = client.consume("orders", wait="10s")
>>> client.ack(msg)
"""

from .client import NO_RETRY, Client, Duration, Lease, RetryPolicy, duration
from .errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    Gone,
    NaradError,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from .models import (
    RESPONSE_SCHEMAS,
    SCHEMAS,
    AckedMessages,
    EntryResult,
    Grant,
    Message,
    PartitionStats,
    Produced,
    Purged,
    Redriven,
    Settings,
    Subscription,
    SubscriptionPartition,
    Topic,
    TopicInfo,
    TopicList,
    Whoami,
)
from .operations import NEWER_THAN_SOME_SERVERS, NOT_CALLED, OPERATIONS, PARAMETERS
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Client", "RetryPolicy", "NO_RETRY", "Duration", "Lease", "duration", "Worker",
    "NaradError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "RequestTimeout",
    "Conflict", "Gone", "PayloadTooLarge", "TooManyRequests", "ServerError", "Unavailable",
    "ConnectionFailed",
    "Message", "Produced", "EntryResult", "AckedMessages", "Settings", "Topic", "TopicInfo",
    "PartitionStats", "TopicList", "Subscription", "SubscriptionPartition", "Purged",
    "Redriven", "Grant", "Whoami", "SCHEMAS", "RESPONSE_SCHEMAS",
    "OPERATIONS", "PARAMETERS", "NOT_CALLED", "NEWER_THAN_SOME_SERVERS",
]
