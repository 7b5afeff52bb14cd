"""SIGTERM stops a worker without losing a message."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable, List

import narad
from helpers import HERE, Proc

SLOW = HERE / "slow_worker.py"


def _lines(path: Path) -> List[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_sigterm_mid_handler_loses_nothing(
    server, client: narad.Client, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2, visibility_timeout_ms=2000)
    count = 8
    results = client.produce_batch(topic, [{"payload": {"n": i}, "partition": i % 2} for i in range(count)])
    ids = {f"{r.partition}/{r.offset}" for r in results}
    assert len(ids) == count

    first = tmp_path / "first.txt"
    worker = Proc(SLOW, [topic, str(first), "1.0"], server.env())
    try:
        # Wait until a handler is in progress, after at least one finished.
        deadline = time.monotonic() + 20
        while True:
            lines = _lines(first)
            starts = [l for l in lines if l.startswith("start")]
            dones = [l for l in lines if l.startswith("done")]
            if dones and len(starts) > len(dones):
                break
            assert time.monotonic() < deadline, f"{lines}\n{worker.stderr()}"
            time.sleep(0.02)
        in_progress = starts[-1].split()[1]
        signalled = time.monotonic()
        rc = worker.stop(signal.SIGTERM, timeout=10)
        assert rc == 0, worker.stderr()
        assert time.monotonic() - signalled < 3.0, "the in-flight handler (1 s) finishes, then it exits"
    finally:
        worker.kill()
    lines = _lines(first)
    assert lines[-1] == "exited"
    assert f"done {in_progress}" in lines, "the handler in progress when SIGTERM came finished"
    assert sum(l.startswith("start") for l in lines) == sum(l.startswith("done") for l in lines)
    processed_first = {l.split()[1] for l in lines if l.startswith("done")}
    assert len(processed_first) < count, "SIGTERM came too late to test anything"

    # What the first worker finished was acked: only the rest is unsettled, nothing in flight
    # beyond a lease abandoned with the poll SIGTERM interrupted.
    info = client.get_topic(topic)
    assert info.unsettled == count - len(processed_first)

    # Drain with a second worker, then check every message was processed and acked.
    second = tmp_path / "second.txt"
    drainer = Proc(SLOW, [topic, str(second), "0.05"], server.env())
    try:
        deadline = time.monotonic() + 30
        while client.get_topic(topic).unsettled:
            assert time.monotonic() < deadline, f"{_lines(second)}\n{drainer.stderr()}"
            time.sleep(0.2)
        signalled = time.monotonic()
        assert drainer.stop(signal.SIGTERM, timeout=10) == 0, drainer.stderr()
        assert time.monotonic() - signalled < 3.0, "an idle worker stops its long poll at once"
    finally:
        drainer.kill()
    processed = processed_first | {l.split()[1] for l in _lines(second) if l.startswith("done")}
    assert processed == ids, f"never processed: {ids - processed}"
    info = client.get_topic(topic)
    assert info.unsettled == 0
    assert all(p.frontier == p.next_offset for p in info.partitions), info.partitions
