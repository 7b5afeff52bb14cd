"""examples/worker.py, the README's 10-line worker, run as it is in a subprocess."""

from __future__ import annotations

import signal
import time
from typing import Callable

import narad
from helpers import EXAMPLE, FaultyProxy, Proc


def test_example_is_at_most_ten_lines_and_in_the_readme() -> None:
    text = EXAMPLE.read_text()
    assert len(text.splitlines()) <= 10
    # The client's README and the project's both show it as it is.
    for readme in (EXAMPLE.parent.parent / "README.md", EXAMPLE.parents[3] / "README.md"):
        assert f"```python\n{text}```" in readme.read_text(), f"{readme} must show examples/worker.py as it is"


def test_failing_handler_gets_its_message_again(server, client: narad.Client, new_topic: Callable[..., str]) -> None:
    # A long timeout: the message can only come back this soon because the worker nacked it.
    topic = new_topic(visibility_timeout_ms=60000)
    client.produce(topic, {"fail": True})
    worker = Proc(EXAMPLE, [topic], server.env())
    try:
        line = worker.expect("done 0/0", timeout=15)
        assert line == "done 0/0 delivery=2", line  # failed once, nacked, delivered again
        assert "RuntimeError: failing once" in worker.stderr()
        deadline = time.monotonic() + 5
        while client.get_topic(topic).unsettled and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get_topic(topic).unsettled == 0  # acked after the second delivery
        assert worker.stop(signal.SIGTERM, timeout=5) == 0
    finally:
        worker.kill()
    assert worker.out == ["done 0/0 delivery=2"]


def test_slow_handler_keeps_its_lease(server, client: narad.Client, new_topic: Callable[..., str]) -> None:
    vt = 1.5
    topic = new_topic(visibility_timeout_ms=int(vt * 1000))
    client.produce(topic, {"sleep": 3 * vt})  # three visibility timeouts
    worker = Proc(EXAMPLE, [topic], server.env())
    try:
        deadline = time.monotonic() + 10
        while client.get_topic(topic).partitions[0].in_flight == 0:
            assert time.monotonic() < deadline, worker.stderr()
            time.sleep(0.05)
        leased_at = time.monotonic()
        # A second consumer meanwhile gets nothing: the heartbeats keep the lease.
        while time.monotonic() - leased_at < 3 * vt - 0.6:
            stolen = client.consume(topic, wait="500ms")
            assert stolen is None, f"redelivered while the handler ran: {stolen}"
        line = worker.expect("done 0/0", timeout=10)
        assert line == "done 0/0 delivery=1"
        assert time.monotonic() - leased_at >= 3 * vt - 0.5
        deadline = time.monotonic() + 5
        while client.get_topic(topic).unsettled and time.monotonic() < deadline:
            time.sleep(0.1)
        # The ack answered 204: the message is settled (a 410 would have left it to lapse and
        # come back), and the worker reported no lost lease.
        assert client.get_topic(topic).unsettled == 0
        assert client.consume(topic, wait="2s") is None
        assert "lost" not in worker.stderr() and "gone" not in worker.stderr(), worker.stderr()
        assert worker.stop(signal.SIGTERM, timeout=5) == 0
    finally:
        worker.kill()


def _settled(client: narad.Client, topic: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while client.get_topic(topic).unsettled and time.monotonic() < deadline:
        time.sleep(0.1)
    return client.get_topic(topic).unsettled == 0


def test_ack_meeting_503_is_retried_until_204(server, client: narad.Client, new_topic: Callable[..., str]) -> None:
    # The example worker talks through a proxy that answers its first three acks 503
    # (Retry-After: 1). The retries (3 s) outlast the 1 s lease: the worker heartbeats until
    # the ack is answered, so the fourth ack still finds the lease its own.
    topic = new_topic(visibility_timeout_ms=1000)
    proxy = FaultyProxy(server.url)
    proxy.failures = 3
    client.produce(topic, {"id": 1})
    worker = Proc(EXAMPLE, [topic], dict(server.env(), NARAD_URL=proxy.url))
    try:
        assert worker.expect("done 0/0", timeout=15) == "done 0/0 delivery=1"
        assert _settled(client, topic, timeout=15), worker.stderr()
        ack = f"/v1/topics/{topic}/ack"
        assert proxy.log == [(ack, 503)] * 3 + [(ack, 204)]
        assert client.consume(topic, wait="1s") is None  # acked once, not redelivered
        assert worker.stop(signal.SIGTERM, timeout=5) == 0
    finally:
        worker.kill()
        proxy.close()
    assert worker.out == ["done 0/0 delivery=1"]


def test_sigterm_stops_it_without_losing_a_message(server, client: narad.Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(visibility_timeout_ms=30000)
    count = 6
    for _ in range(count):
        client.produce(topic, {"sleep": 0.8})
    first = Proc(EXAMPLE, [topic], server.env())
    try:
        first.expect("done 0/0", timeout=15)
        # Mid-way through the next handler (0.8 s): SIGTERM lets it finish and acks it. (A
        # signal during a long poll abandons it, and a message that poll leased would come
        # back only after its visibility timeout: not lost, but not what this test waits for.)
        time.sleep(0.3)
        started = time.monotonic()
        assert first.stop(signal.SIGTERM, timeout=10) == 0, first.stderr()
        assert time.monotonic() - started < 5
    finally:
        first.kill()
    # Whatever the first run had leased is settled: nothing is in flight, so a second run
    # gets every remaining message at once rather than after a visibility timeout.
    assert client.get_topic(topic).partitions[0].in_flight == 0
    second = Proc(EXAMPLE, [topic], server.env())
    try:
        for offset in range(len(first.out), count):
            second.expect(f"done 0/{offset} ", timeout=15)
        assert second.stop(signal.SIGTERM, timeout=10) == 0, second.stderr()
    finally:
        second.kill()
    done = [line.split()[1] for line in first.out + second.out]
    assert sorted(done, key=lambda po: int(po.split("/")[1])) == [f"0/{o}" for o in range(count)]
    assert _settled(client, topic, timeout=5)
