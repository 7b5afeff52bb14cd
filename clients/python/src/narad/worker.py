"""A consumer loop that keeps the consumer contract for you.

:class:`Worker` long-polls a topic, runs your handler on each message (or, with
``batch=True``, on each batch) in a thread of its own, and meanwhile heartbeats the lease
(``extend=true``) every third of the visibility timeout, until the message is settled (an ack
retried after 503s keeps its lease). When the handler returns, the message is acked; when it
raises, the exception is logged and the message nacked
(``extend=0``), so it is delivered again at once. A 410 on an ack or extend is logged and
skipped: the lease lapsed and the message is someone else's now (handlers must tolerate
duplicates). Acks, extends and nacks are retried on 503 by the client.

SIGTERM or SIGINT (or :meth:`Worker.stop`) stops it gracefully: no new consume; a long poll in
progress is abandoned; the handler in progress finishes and is acked, unless ``stop_timeout``
passes first, in which case its messages are nacked and :meth:`run` returns anyway.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, List, Optional, Sequence, Set, Union

from .client import Client, Duration
from .errors import BadRequest, Forbidden, Gone, NaradError, NotFound, Unauthorized
from .models import Message

log = logging.getLogger("narad.worker")

Handler = Callable[[Message], Any]
BatchHandler = Callable[[List[Message]], Any]


class _StopPolling(BaseException):
    """Raised by the signal handler to abandon a long poll (never escapes run())."""


class Worker:
    """Consumes ``topic`` (or its ``subscription``) and runs ``handler`` on each message.

    Parameters:
        client: the :class:`Client` to use.
        topic: the topic to consume.
        handler: called with each :class:`Message` (with ``batch=True``, with each list).
        subscription: consume this subscription instead of the topic's default one.
        batch: call the handler once per consumed batch; all of it is acked, or all nacked.
        max: lease up to this many messages per consume (default 1, or 10 with ``batch``).
        wait: long-poll duration of each consume (the server caps it, 10 s by default).
        heartbeat: seconds between extends; default a third of the visibility timeout, read
            from the topic's (or subscription's) settings when :meth:`run` starts.
        stop_timeout: seconds a stop waits for the handler in progress before nacking.
        handle_signals: install SIGTERM and SIGINT handlers (only possible, and only done,
            when :meth:`run` is called from the main thread).
    """

    def __init__(
        self,
        client: Client,
        topic: str,
        handler: Union[Handler, BatchHandler],
        *,
        subscription: Optional[str] = None,
        batch: bool = False,
        max: Optional[int] = None,
        wait: Duration = "10s",
        heartbeat: Optional[float] = None,
        stop_timeout: float = 30.0,
        handle_signals: bool = True,
    ) -> None:
        self.client = client
        self.topic = topic
        self.handler = handler
        self.subscription = subscription
        self.batch = batch
        self.max = max if max is not None else (10 if batch else 1)
        self.wait = wait
        self.heartbeat = heartbeat
        self.stop_timeout = stop_timeout
        self.handle_signals = handle_signals
        self._stop = threading.Event()
        self._polling = False
        self._stop_deadline: Optional[float] = None

    # ----------------------------------------------------------------- control

    def stop(self) -> None:
        """Asks the worker to stop: no new consume; the handler in progress may finish.

        From another thread, a long poll in progress runs to its end (at most ``wait``).
        """
        if not self._stop.is_set():
            self._stop_deadline = time.monotonic() + self.stop_timeout
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        log.info("narad worker: signal %d, stopping", signum)
        self.stop()
        if self._polling:
            raise _StopPolling()

    # ----------------------------------------------------------------- the loop

    def run(self) -> None:
        """Runs until stopped. Returns normally after a graceful stop.

        Raises :class:`NaradError` when consuming cannot work (400, 401, 403, 404: a wrong
        topic, subscription or credentials); other consume failures are logged and retried.
        A long poll abandoned by a signal may have leased a message whose answer never
        arrived: that lease lapses after the visibility timeout and the message comes again.
        """
        if self.heartbeat is None:
            vt = self.client.visibility_timeout(self.topic, self.subscription)
            self.heartbeat = max(vt / 3.0, 0.05)
        previous = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            while not self._stop.is_set():
                try:
                    messages = self._poll()
                except _StopPolling:  # the signal came just as the poll returned
                    continue
                if not messages:
                    continue
                if self.batch:
                    self._process(messages, messages)
                else:
                    for i, msg in enumerate(messages):
                        if self._stop.is_set():
                            # Stopped between messages: give the rest back at once.
                            self._settle(messages[i:], "nack")
                            break
                        self._process([msg], msg, also_heartbeat=messages[i + 1:])
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _poll(self) -> List[Message]:
        try:
            self._polling = True
            if self._stop.is_set():
                return []
            return self.client.consume(
                self.topic, self.max, wait=self.wait, subscription=self.subscription
            )
        except _StopPolling:
            return []
        except (BadRequest, Unauthorized, Forbidden, NotFound):
            raise  # a wrong topic, subscription or credentials: retrying will not help
        except NaradError as e:
            if self._stop.is_set():
                return []
            log.warning("narad worker: consume of %s failed: %s; retrying", self.topic, e)
            self._stop.wait(1.0)
            return []
        finally:
            self._polling = False

    def _process(
        self,
        messages: List[Message],
        arg: Union[Message, List[Message]],
        also_heartbeat: Sequence[Message] = (),
    ) -> None:
        leased = list(messages) + list(also_heartbeat)
        gone: Set[Optional[str]] = set()
        done = threading.Event()  # the handler returned or raised
        # Heartbeats go on until the messages are settled, not only while the handler runs:
        # an ack retried after 503s for longer than the visibility timeout still finds the
        # lease ours.
        settling = threading.Event()  # a 410 from now on may be our own ack racing the extend
        released = threading.Event()  # settled: the heartbeat ends
        outcome: List[Optional[BaseException]] = []

        def call() -> None:
            try:
                self.handler(arg)  # type: ignore[arg-type]
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - reported, then the message is nacked
                outcome.append(e)
            finally:
                done.set()

        def beat() -> None:
            assert self.heartbeat is not None
            while not released.wait(self.heartbeat):
                for m in leased:
                    if m.receipt_handle in gone or released.is_set():
                        continue
                    try:
                        self.client.extend(m)
                    except Gone as e:
                        if settling.is_set():
                            continue  # settled meanwhile; a lease truly lost shows in the ack
                        gone.add(m.receipt_handle)
                        log.warning(
                            "narad worker: lease of %s/%d/%d lost (%s); its work may run twice",
                            m.topic, m.partition, m.offset, e.code,
                        )
                    except NaradError as e:
                        log.warning("narad worker: extend of %s/%d/%d failed: %s",
                                    m.topic, m.partition, m.offset, e)

        runner = threading.Thread(target=call, name="narad-handler", daemon=True)
        beater = threading.Thread(target=beat, name="narad-heartbeat", daemon=True)
        runner.start()
        beater.start()
        try:
            while not done.wait(0.1):
                if self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
                    log.warning(
                        "narad worker: handler still running %.1fs after stop; nacking",
                        self.stop_timeout,
                    )
                    # The handler thread is abandoned.
                    settling.set()
                    self._settle([m for m in messages if m.receipt_handle not in gone], "nack")
                    self._stop.set()
                    return
            settling.set()
            live = [m for m in messages if m.receipt_handle not in gone]
            error = outcome[0] if outcome else None
            if error is None:
                self._settle(live, "ack")
            else:
                first = messages[0]
                log.error(
                    "narad worker: handler failed on %s/%d/%d (delivery %d); nacking",
                    first.topic, first.partition, first.offset, first.delivery_count,
                    exc_info=(type(error), error, error.__traceback__),
                )
                self._settle(live, "nack")
        finally:
            released.set()
            # Bounded: an extend in progress may be retrying 503s; a late one is harmless.
            beater.join(timeout=5.0)

    def _settle(self, messages: Sequence[Message], how: str) -> None:
        if not messages:
            return
        try:
            if len(messages) == 1:
                m = messages[0]
                if how == "ack":
                    self.client.ack(m)
                else:
                    self.client.nack(m)
                return
            results = self.client.settle_batch(
                self.topic, list(messages), extend=0 if how == "nack" else None
            )
            for m, r in zip(messages, results):
                if r.status == 410:
                    log.warning("narad worker: %s of %s/%d/%d: gone; its work may run twice",
                                how, m.topic, m.partition, m.offset)
                elif r.status != 204:
                    log.error("narad worker: %s of %s/%d/%d answered %d %s",
                              how, m.topic, m.partition, m.offset, r.status, r.error)
        except Gone as e:
            m = messages[0]
            log.warning("narad worker: %s of %s/%d/%d: %s; its work may run twice",
                        how, m.topic, m.partition, m.offset, e.code)
        except NaradError as e:
            log.error("narad worker: %s of %d message(s) failed: %s", how, len(messages), e)
