"""Retries against a real server behind a small HTTP proxy that answers 503 on purpose."""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Iterator, List, Tuple

import pytest

import narad

FORWARDED_HEADERS = ("authorization", "content-type", "idempotency-key")


class FaultyProxy:
    """Forwards to ``upstream``, but answers 503 (``Retry-After``, JSON error body) to the
    first ``failures`` requests whose path ends with ``suffix``. Logs (path, status) of those."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.suffix = "/ack"
        self.failures = 0
        self.retry_after = "1"
        self.log: List[Tuple[str, int]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = urllib.parse.urlsplit(self.path).path
                watched = path.endswith(proxy.suffix)
                with proxy.lock:
                    fail = watched and proxy.failures > 0
                    if fail:
                        proxy.failures -= 1
                if fail:
                    status = 503
                    data = json.dumps({"error": {"code": "acked_ahead_full", "message": "proxy says wait"}}).encode()
                    out = {"Retry-After": proxy.retry_after, "Content-Type": "application/json"}
                else:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() in FORWARDED_HEADERS or k.lower().startswith("narad-header-")}
                    req = urllib.request.Request(proxy.upstream + self.path, data=body,
                                                 headers=headers, method=self.command)
                    try:
                        with urllib.request.urlopen(req, timeout=30) as r:
                            status, rh, data = r.status, r.headers, r.read()
                    except urllib.error.HTTPError as e:
                        status, rh, data = e.code, e.headers, e.read()
                    out = {k: rh[k] for k in ("Content-Type", "Retry-After", "X-Request-Id") if rh.get(k)}
                if watched:  # logged before the client can see the answer
                    with proxy.lock:
                        proxy.log.append((path, status))
                self.send_response(status)
                for k, v in out.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(server) -> Iterator[FaultyProxy]:
    p = FaultyProxy(server.url)
    yield p
    p.close()


def test_ack_meeting_503_is_retried_until_204(
    server, client: narad.Client, proxy: FaultyProxy, new_topic: Callable[..., str]
) -> None:
    # Long enough for three retries a second apart: the lease must still be ours at the end.
    topic = new_topic(visibility_timeout_ms=8000)
    via_proxy = narad.Client(proxy.url, server.user, server.password)
    client.produce(topic, "must be acked once")
    m = via_proxy.consume(topic, wait="2s")
    assert m is not None
    proxy.failures = 3
    started = time.monotonic()
    via_proxy.ack(m)  # returns only on 204
    elapsed = time.monotonic() - started
    assert proxy.log == [(f"/v1/topics/{topic}/ack", 503)] * 3 + [(f"/v1/topics/{topic}/ack", 204)]
    assert elapsed >= 3.0, "each retry waits Retry-After (1 s)"
    assert elapsed < 15.0
    # Not redelivered: the message is settled (a lapsed lease would leave it unsettled, to
    # come back), and nothing comes back.
    info = client.get_topic(topic)
    assert info.unsettled == 0 and info.partitions[0].frontier == info.partitions[0].next_offset == 1
    assert client.consume(topic, wait="1s") is None


def test_retries_are_bounded(server, proxy: FaultyProxy, client: narad.Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    client.produce(topic, "x")
    m = client.consume(topic, wait="2s")
    assert m is not None
    proxy.failures, proxy.retry_after = 1000, "0"
    limited = narad.Client(proxy.url, server.user, server.password,
                           retry=narad.RetryPolicy(max_attempts=3, base_delay=0.01))
    with pytest.raises(narad.Unavailable) as err:
        limited.ack(m)
    assert err.value.status == 503 and err.value.code == "acked_ahead_full"
    assert err.value.message == "proxy says wait" and err.value.retry_after == 0
    assert len(proxy.log) == 3
    client.ack(m)


def test_produce_is_retried_only_with_an_idempotency_key(
    server, proxy: FaultyProxy, client: narad.Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    via_proxy = narad.Client(proxy.url, server.user, server.password)
    proxy.suffix, proxy.failures, proxy.retry_after = "/produce", 1, "0"
    with pytest.raises(narad.Unavailable):
        via_proxy.produce(topic, "no key")  # it might have been stored: not repeated
    assert [s for _, s in proxy.log] == [503]
    proxy.log.clear()
    proxy.failures = 2
    produced = via_proxy.produce(topic, "keyed", idempotency_key="k-1")
    assert [s for _, s in proxy.log] == [503, 503, 201]
    assert produced.offset == 0
    assert client.get_topic(topic).partitions[0].next_offset == 1
