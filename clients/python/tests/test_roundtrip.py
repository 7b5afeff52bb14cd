"""Round trips through a real server: produce, consume, ack, extend, nack, replay, batches,
topic and subscription admin, and payload decoding."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Callable

import pytest

import narad
from narad import Client


def test_produce_consume_ack_and_payload_kinds(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(visibility_timeout_ms=5000)
    raw = bytes(range(256))  # not UTF-8: the server sends it base64
    p1 = client.produce(topic, {"id": 1, "total": 10.0}, key="customer-7", headers={"trace-id": "abc"})
    p2 = client.produce(topic, "hello world")
    p3 = client.produce(topic, raw)
    assert (p1.partition, p1.offset, p2.offset, p3.offset) == (0, 0, 1, 2)

    m1 = client.consume(topic, wait="2s")
    assert m1 is not None and m1.offset == 0
    assert m1.payload == {"id": 1, "total": 10.0} and m1.payload_encoding is None
    assert m1.key == "customer-7" and m1.headers == {"trace-id": "abc"}
    assert m1.delivery_count == 1 and m1.receipt_handle and m1.produced_at
    m2 = client.consume(topic, wait="2s")
    assert m2 is not None and m2.payload == "hello world" and m2.body == b"hello world"
    m3 = client.consume(topic, wait="2s")
    assert m3 is not None and m3.payload_encoding == "base64"
    assert isinstance(m3.payload, bytes) and m3.payload == raw and m3.body == raw
    assert client.consume(topic, wait=0) is None  # 204: nothing else

    for m in (m1, m2, m3):
        client.ack(m)
    with pytest.raises(narad.Gone) as gone:  # a second ack: the lease is not ours any more
        client.ack(m1)
    assert gone.value.status == 410 and gone.value.code == "lease_gone"
    with pytest.raises(narad.Gone):
        client.extend(m2.topic, m2.receipt_handle)
    assert client.get_topic(topic).unsettled == 0


def test_extend_nack_retry_later(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(visibility_timeout_ms=1500)
    client.produce(topic, "work")
    m = client.consume(topic, wait="2s")
    assert m is not None
    for _ in range(4):  # 2 s in all, beyond the 1.5 s timeout: extends keep the lease
        time.sleep(0.5)
        client.extend(m)
    assert client.consume(topic, wait=0) is None
    client.nack(m)  # given back at once
    again = client.consume(topic, wait="2s")
    assert again is not None and again.offset == m.offset and again.delivery_count == 2
    with pytest.raises(narad.Gone):
        client.ack(m)  # the first lease ended with the nack
    client.retry_later(again, after=1)
    assert client.consume(topic, wait="500ms") is None
    third = client.consume(topic, wait="3s")
    assert third is not None and third.delivery_count == 3
    client.ack(third)


def test_replay_is_read_only(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    client.produce(topic, b"\x00\xff\x10", key="k")
    r = client.replay(topic, 0, 0)
    assert r.receipt_handle is None and r.payload == b"\x00\xff\x10" and r.key == "k"
    m = client.consume(topic, wait="2s")  # the replay leased nothing
    assert m is not None and m.delivery_count == 1
    client.ack(m)
    with pytest.raises(ValueError):
        client.ack(r)  # a replay has no handle to settle


def test_idempotent_produce(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=3)
    a = client.produce(topic, {"id": 1234}, idempotency_key="order-1234")
    b = client.produce(topic, {"id": 1234}, idempotency_key="order-1234")
    assert a == b
    assert sum(p.next_offset for p in client.get_topic(topic).partitions) == 1


def test_batches(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    results = client.produce_batch(
        topic,
        [
            {"payload": {"id": 1}, "key": "customer-7"},
            {"payload": "plain text", "partition": 1},
            {"payload": b"\x00\xff\x10", "headers": {"kind": "raw"}},
            {"payload": [1, 2], "idempotency_key": "batch-1"},
            42,
        ],
    )
    assert [r.status for r in results] == [201] * 5
    msgs = client.consume(topic, 10, wait="2s")
    for _ in range(5):
        if len(msgs) == 5:
            break
        msgs += client.consume(topic, 10, wait="1s")
    assert len(msgs) == 5
    by_payload = {json.dumps(m.payload) if not isinstance(m.payload, bytes) else m.payload: m for m in msgs}
    assert b"\x00\xff\x10" in by_payload and by_payload[b"\x00\xff\x10"].headers == {"kind": "raw"}
    assert {'{"id": 1}', '"plain text"', "[1, 2]", "42"} <= set(by_payload)

    renewed = client.settle_batch(topic, msgs, extend=True)
    assert [r.status for r in renewed] == [204] * 5
    acked = client.settle_batch(topic, msgs[:4])
    assert [r.status for r in acked] == [204] * 4
    again = client.settle_batch(topic, [msgs[0], msgs[4]])
    assert [r.status for r in again] == [410, 204]
    assert again[0].error is not None and again[0].error["code"] == "lease_gone"
    assert client.get_topic(topic).unsettled == 0


def test_batch_nack_and_consume_acking(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    client.produce_batch(topic, ["a", "b", "c"])
    msgs = client.consume(topic, 3, wait="2s")
    assert [m.payload for m in msgs] == ["a", "b", "c"]
    assert [r.status for r in client.settle_batch(topic, msgs, extend=0)] == [204] * 3
    first = client.consume(topic, wait="2s")
    assert first is not None and first.payload == "a" and first.delivery_count == 2
    answer = client.consume_acking(topic, [first], max=2, wait="2s")
    assert [a.status for a in answer.acks] == [204]
    assert [m.payload for m in answer.messages] == ["b", "c"]
    done = client.consume_acking(topic, answer.messages, wait=0)
    assert [a.status for a in done.acks] == [204, 204] and done.messages == []


def test_topic_admin(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2, visibility_timeout_ms=30000)
    same = client.create_topic(topic, partitions=2, visibility_timeout_ms=30000)  # 200: same
    assert same.name == topic and same.settings.partitions == 2
    with pytest.raises(narad.Conflict) as conflict:
        client.create_topic(topic, partitions=3)
    assert conflict.value.status == 409 and conflict.value.code == "topic_exists"
    info = client.get_topic(topic)
    assert [p.partition for p in info.partitions] == [0, 1]
    changed = client.patch_topic(topic, visibility_timeout_ms=60000, paused=True)
    assert changed.settings.visibility_timeout_ms == 60000 and changed.settings.paused
    assert client.visibility_timeout(topic) == 60.0
    client.produce(topic, "x")
    assert client.consume(topic, wait=0) is None  # paused
    client.patch_topic(topic, paused=False)
    names = [t.name for t in client.iter_topics(page_size=1)]
    assert topic in names
    assert client.purge(topic) == 1
    with pytest.raises(narad.BadRequest) as bad:
        client.patch_topic(topic, no_such_setting=1)
    assert bad.value.code == "invalid_setting" or bad.value.status == 400
    client.delete_topic(topic)
    with pytest.raises(narad.NotFound) as nf:
        client.get_topic(topic)
    assert nf.value.code == "topic_not_found"


def test_subscriptions_and_cancel(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    sub = client.create_subscription(topic, "billing", visibility_timeout_ms=2000)
    assert sub.name == "billing" and sub.effective["visibility_timeout_ms"] == 2000
    client.produce(topic, "signup")
    for name in (None, "billing"):  # each subscription gets the message, with its own handle
        m = client.consume(topic, wait="2s", subscription=name)
        assert m is not None and m.payload == "signup"
        client.ack(m)
    got = client.get_subscription(topic, "billing")
    assert got.partitions is not None and got.partitions[0].available == 0
    patched = client.patch_subscription(topic, "billing", max_in_flight_per_partition=5)
    assert patched.settings.get("max_in_flight_per_partition") == 5
    assert patched.effective["max_in_flight_per_partition"] == 5
    assert [s.name for s in client.list_subscriptions(topic)] == ["billing"]
    assert client.visibility_timeout(topic, "billing") == 2.0

    delayed = client.produce(topic, "reminder", delay="1h")
    assert client.get_topic(topic).partitions[0].delayed == 1
    client.cancel_message(topic, delayed.partition, delayed.offset)
    assert client.get_topic(topic).partitions[0].delayed == 0
    with pytest.raises(narad.NotFound):
        client.cancel_message(topic, 0, 999)
    client.delete_subscription(topic, "billing")
    with pytest.raises(narad.NotFound) as nf:
        client.get_subscription(topic, "billing")
    assert nf.value.code == "subscription_not_found"


def test_dead_letters_and_redrive(client: Client, new_topic: Callable[..., str]) -> None:
    dlq = new_topic()
    topic = new_topic(max_deliveries=1, dead_letter_topic=dlq, visibility_timeout_ms=500)
    client.produce(topic, "poison")
    m = client.consume(topic, wait="2s")
    assert m is not None
    client.nack(m)
    deadline = time.monotonic() + 10
    dead = None
    while dead is None and time.monotonic() < deadline:
        client.consume(topic, wait=0)  # moves the message on, if nothing else has
        dead = client.consume(dlq, wait="500ms")
    assert dead is not None and dead.payload == "poison"
    assert dead.headers is not None and dead.headers["narad-source-topic"] == topic
    client.nack(dead)
    moved = client.redrive(dlq)
    assert (moved.moved, moved.failed) == (1, 0)
    back = client.consume(topic, wait="5s")
    assert back is not None and back.payload == "poison"
    client.ack(back)


def test_errors_carry_status_code_and_message(server, client: Client) -> None:
    with pytest.raises(narad.NotFound) as nf:
        client.produce("py-no-such-topic", "x")
    assert nf.value.status == 404 and nf.value.code == "topic_not_found" and nf.value.message
    with pytest.raises(narad.BadRequest) as bad:
        client.ack("py-no-such-topic", "not-a-handle")
    assert bad.value.status == 400
    wrong = narad.Client(server.url, server.user, "wrong-password")
    with pytest.raises(narad.Unauthorized) as unauth:
        wrong.list_topics()
    assert unauth.value.status == 401 and unauth.value.code == "unauthorized"
    dead = narad.Client("http://127.0.0.1:9", retry=narad.RetryPolicy(max_attempts=2, base_delay=0.01))
    with pytest.raises(narad.ConnectionFailed):
        dead.list_topics()


def _openapi(server) -> dict:
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=10) as r:
        return json.load(r)


def test_whoami(server, client: Client) -> None:
    ops = {o.get("operationId") for p in _openapi(server)["paths"].values() for o in p.values() if isinstance(o, dict)}
    if "whoami" not in ops:
        pytest.skip("this server's /openapi.json has no whoami operation yet")
    me = client.whoami()
    assert me.user == server.user
    assert all(isinstance(g, narad.Grant) for g in me.grants)
    # The tests' user comes from NARAD_AUTH, which holds every right.
    assert any(g.topics == "*" and {"produce", "consume", "admin"} <= set(g.actions) for g in me.grants), me
