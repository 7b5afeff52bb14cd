"""Retries against a real server behind a small HTTP proxy that answers 503 on purpose."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import pytest

import narad
from helpers import FaultyProxy


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
