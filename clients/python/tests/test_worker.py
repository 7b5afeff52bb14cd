"""The Worker in this process: batch mode, stop timeout, and a 410 on ack skipped."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, List

import pytest

import narad


def _run(worker: narad.Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def test_batch_mode_acks_all_or_nacks_all(client: narad.Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(visibility_timeout_ms=3000)
    client.produce_batch(topic, [{"payload": {"n": i}} for i in range(5)])
    calls: List[List[int]] = []

    def handler(batch: List[narad.Message]) -> None:
        calls.append([m.delivery_count for m in batch])
        if len(calls) == 1:
            raise ValueError("the whole batch fails once")
        if sum(len(c) for c in calls[1:]) >= 5:
            worker.stop()

    worker = narad.Worker(client, topic, handler, batch=True, max=5, wait="1s", handle_signals=False)
    t = _run(worker)
    t.join(20)
    assert not t.is_alive()
    assert calls[0] == [1] * 5
    assert sorted(d for c in calls[1:] for d in c) == [2] * 5
    assert client.get_topic(topic).unsettled == 0


def test_stop_timeout_nacks_the_message_in_progress(client: narad.Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(visibility_timeout_ms=30000)
    client.produce(topic, "slow")
    started = threading.Event()

    def handler(msg: narad.Message) -> None:
        started.set()
        time.sleep(5)

    worker = narad.Worker(client, topic, handler, wait="1s", stop_timeout=0.5, handle_signals=False)
    t = _run(worker)
    assert started.wait(10)
    stopped_at = time.monotonic()
    worker.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - stopped_at < 2.5
    again = client.consume(topic, wait="1s")  # nacked: back at once, not after 30 s
    assert again is not None and again.delivery_count == 2
    client.ack(again)


def test_gone_on_ack_is_logged_and_skipped(
    client: narad.Client, new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(visibility_timeout_ms=300)
    client.produce(topic, "first")
    seen: List[str] = []
    taken: List[narad.Message] = []

    def handler(msg: narad.Message) -> None:
        seen.append(msg.payload)
        if msg.payload == "first":
            # No heartbeat (see below): the lease lapses and another consumer takes it.
            deadline = time.monotonic() + 10
            while not taken and time.monotonic() < deadline:
                m = client.consume(topic, wait="500ms")
                if m is not None:
                    taken.append(m)
            client.produce(topic, "second")
        else:
            worker.stop()

    caplog.set_level(logging.WARNING, logger="narad.worker")
    worker = narad.Worker(client, topic, handler, wait="1s", heartbeat=1000, handle_signals=False)
    t = _run(worker)
    t.join(30)
    assert not t.is_alive()
    assert seen == ["first", "second"], "the worker went on after the 410"
    assert taken and taken[0].delivery_count == 2
    assert any("lease_gone" in r.getMessage() for r in caplog.records), caplog.text
    client.ack(taken[0])


def test_messages_waiting_their_turn_are_heartbeaten(client: narad.Client, new_topic: Callable[..., str]) -> None:
    # max=3 leases three at once; they are handled one by one, 1 s each, so the last waits
    # 2 s, beyond the 1.5 s timeout: the heartbeat must cover the waiting ones too.
    topic = new_topic(visibility_timeout_ms=1500)
    client.produce_batch(topic, ["a", "b", "c"])
    seen: List[tuple] = []

    def handler(msg: narad.Message) -> None:
        seen.append((msg.payload, msg.delivery_count))
        time.sleep(1.0)
        if len(seen) == 3:
            worker.stop()

    worker = narad.Worker(client, topic, handler, max=3, wait="1s", handle_signals=False)
    t = _run(worker)
    t.join(20)
    assert not t.is_alive()
    assert seen == [("a", 1), ("b", 1), ("c", 1)]
    assert client.get_topic(topic).unsettled == 0
