"""examples/worker.py, the README's 10-line worker, run as it is in a subprocess."""

from __future__ import annotations

import signal
import time
from typing import Callable

import narad
from helpers import EXAMPLE, Proc


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
