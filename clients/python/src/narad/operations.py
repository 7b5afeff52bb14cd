"""The API operations this client calls: operationId -> (HTTP method, path template).

Every request the client sends is built from this table, with the operationIds of the
server's OpenAPI document (``GET /openapi.json``). The tests compare it with the live
document both ways, so an operation the server adds, moves or drops fails them.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

OPERATIONS: Dict[str, Tuple[str, str]] = {
    # topics
    "listTopics": ("GET", "/v1/topics"),
    "createTopic": ("PUT", "/v1/topics/{topic}"),
    "getTopic": ("GET", "/v1/topics/{topic}"),
    "changeTopic": ("PATCH", "/v1/topics/{topic}"),
    "deleteTopic": ("DELETE", "/v1/topics/{topic}"),
    "purgeTopic": ("POST", "/v1/topics/{topic}/purge"),
    "redrive": ("POST", "/v1/topics/{topic}/redrive"),
    # messages
    "produce": ("POST", "/v1/topics/{topic}/produce"),
    "produceBatch": ("POST", "/v1/topics/{topic}/produce-batch"),
    "consume": ("GET", "/v1/topics/{topic}/consume"),
    "consumeAcking": ("POST", "/v1/topics/{topic}/consume"),
    "ack": ("POST", "/v1/topics/{topic}/ack"),
    "cancelMessage": ("DELETE", "/v1/topics/{topic}/messages/{partition}/{offset}"),
    # subscriptions
    "listSubscriptions": ("GET", "/v1/topics/{topic}/subscriptions"),
    "createSubscription": ("PUT", "/v1/topics/{topic}/subscriptions/{subscription}"),
    "getSubscription": ("GET", "/v1/topics/{topic}/subscriptions/{subscription}"),
    "patchSubscription": ("PATCH", "/v1/topics/{topic}/subscriptions/{subscription}"),
    "deleteSubscription": ("DELETE", "/v1/topics/{topic}/subscriptions/{subscription}"),
    # the caller
    "whoami": ("GET", "/v1/whoami"),
}

# Operations of the document this client deliberately does not call (none under /v1): the
# health probe, the document itself, the web console and its assets, and Prometheus metrics.
NOT_CALLED: FrozenSet[str] = frozenset(
    {"health", "openapi", "console", "consoleScript", "consoleStyle", "metrics"}
)

# Operations in OPERATIONS that a server may not serve yet (newer than some servers): the
# drift test allows them to be missing from the document, and checks them once present.
NEWER_THAN_SOME_SERVERS: FrozenSet[str] = frozenset({"whoami"})

# The query (and header) parameters the client sends, per operation: every one it may send,
# and only those. The client refuses to build a request with another; the tests check this
# table against each operation's parameters in the document (path parameters aside).
PARAMETERS: Dict[str, FrozenSet[str]] = {
    "listTopics": frozenset({"limit", "after"}),
    "produce": frozenset({"partition", "key", "delay", "Idempotency-Key"}),
    "consume": frozenset({"wait", "partition", "offset", "max", "subscription"}),
    "consumeAcking": frozenset({"wait", "partition", "max", "subscription"}),
    "ack": frozenset({"receipt_handle", "extend"}),
    "purgeTopic": frozenset({"subscription"}),
    "redrive": frozenset({"max"}),
    "cancelMessage": frozenset({"subscription"}),
}
