#!/usr/bin/env python3
"""Object-store fault test: three `narad serve` processes on one S3 store, through a seeded
fault proxy (proxy.py), under a mixed workload; then a drain, a replay of every offset, and a
check of the whole history.

The proxy drops answers after the store applied a request, answers 503 SlowDown or 500
after applying, resets connections and delays requests, each at random at `--rate`. Its
targeted case (profiles `targeted` and `mixed`) loses the answer to a conditional PUT of a
manifest or subscription ledger, then holds that process's next GETs of the object for
4-12 s while the other two processes keep committing, so the writer's recovery read
(docs/design.md §3) comes after many other commits.

Workload, for `--seconds`, spread over the processes: single produces with and without
Idempotency-Key, produce-batches mixing messages with and without idempotency keys (every
message carries a unique id in its payload); consumers of the topic and of a subscription
that consume with a wait, ack, extend then ack, nack, or hold a message past its 2 s
visibility timeout, and retry answers 503 after Retry-After (as clients/python does).

Checks (each violation is printed; the exit status is 1 if there is any):
- every produce answered 201 holds its payload at the offset it was told, and was delivered
  on the topic and on the subscription;
- a message acked 204 is never delivered again after that answer;
- no two live leases on one message (a second delivery while the first lease must still be
  live and was not settled);
- no request's message stored twice (one payload id at two offsets), except a message
  without an idempotency key whose produce the client sent more than once;
- no landed ack answered 410: an ack answered 410 at its first attempt whose lease was the
  message's last delivery, though the drain left nothing unsettled;
- no answer 500, and every 503 carries Retry-After.

Replay a run with its seed (printed at the start): NARAD_S3_FAULT_SEED=N, or --seed N.
NARAD_S3_FAULT_LOG sets the processes' NARAD_LOG (default warn; add
`,narad_shared::http::trace=debug` for a line per request) and --keep-logs keeps their logs
and the history (history.json) in a temporary directory it names. The
proxy's decisions replay per process and request sequence; the timing of processes does
not, so a replay is the same fault mix, not the same interleaving.

    tests/s3-faults/run.py --narad target/debug/narad --endpoint 127.0.0.1:4566 \\
        --access-key test --secret-key test [--profile mixed] [--seconds 60] [--rate 0.06]

Standard library only (Python 3.11).
"""
from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PROCESSES = 3
VISIBILITY_MS = 2000
SUB = "audit"
HTTP_TIMEOUT = 60.0  # every request to narad; a hold is at most 12 s
MAX_ATTEMPTS = 8  # per request, for answers 503 and 429


START = time.monotonic()


def at(t: float) -> str:
    """A monotonic time as seconds since the run started."""
    return f"{t - START:.3f}"


def lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the history ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int  # 0: no answer (connection failed or timed out)
    headers: dict[str, str]
    body: bytes
    t0: float
    t1: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Sent:
    """One message a producer sent, in one request (maybe sent more than once)."""

    uid: str
    idem_key: str | None
    route: str
    attempts: int = 0  # times the request went out
    status: int = 0  # the final answer for this message (per entry in a batch)
    partition: int | None = None
    offset: int | None = None


@dataclass
class Settle:
    kind: str  # ack, extend, nack
    t0: float  # the first attempt's start
    t1: float  # the final answer
    status: int  # the final answer
    first_status: int  # the first attempt's answer
    attempts: int


@dataclass
class Delivery:
    sub: str  # "" for the topic's default subscription
    partition: int
    offset: int
    uid: str
    count: int  # delivery_count
    consumer: str
    t0: float  # the consume request went out
    t1: float  # its answer came back
    handle: str = ""
    settles: list[Settle] = field(default_factory=list)


class History:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[Sent] = []
        self.deliveries: list[Delivery] = []
        self.answers: collections.Counter[str] = collections.Counter()
        self.violations: list[str] = []
        self.client_retries = 0
        self.void_offsets = 0

    def answer(self, route: str, status: int) -> None:
        with self.lock:
            self.answers[f"{route} {status or 'no-answer'}"] += 1

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)


# --- the HTTP client -----------------------------------------------------------------------


class Narad:
    """One `narad serve` process, called with urllib; every call recorded in the history."""

    def __init__(self, index: int, url: str, auth: str, history: History, topic: str) -> None:
        self.index = index
        self.url = url
        self.auth = "Basic " + base64.b64encode(auth.encode()).decode()
        self.h = history
        self.topic = topic
        self.stopping: threading.Event | None = None  # set: no more retries

    def once(self, method: str, path: str, route: str, body: Any = None,
             headers: dict[str, str] | None = None, timeout: float = HTTP_TIMEOUT) -> Answer:
        data = None
        hdrs = {"Authorization": self.auth, **(headers or {})}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                ans = Answer(r.status, lower(r.headers), r.read(), t0, time.monotonic())
        except urllib.error.HTTPError as e:
            ans = Answer(e.code, lower(e.headers), e.read(), t0, time.monotonic())
        except (OSError, urllib.error.URLError) as e:
            ans = Answer(0, {}, str(e).encode(), t0, time.monotonic())
        self.h.answer(route, ans.status)
        if ans.status == 500:
            self.h.violation(f"500 on {route} (process {self.index}): {ans.body[:300]!r}")
        if ans.status == 503 and "retry-after" not in ans.headers:
            self.h.violation(f"503 without Retry-After on {route} (process {self.index}): {ans.body[:300]!r}")
        if ans.status == 0:
            self.h.violation(f"no answer on {route} from process {self.index} after "
                             f"{ans.t1 - t0:.1f} s: {ans.body[:200]!r}")
        if ans.status == 200 and route.startswith("POST ack") and body is not None:
            for res in ans.json()["results"]:
                if res["status"] == 500:
                    self.h.violation(f"batch entry 500 on {route}: {res}")
        return ans

    def retrying(self, method: str, path: str, route: str, body: Any = None,
                 headers: dict[str, str] | None = None, deadline: float | None = None,
                 others: list[Narad] | None = None) -> tuple[Answer, Answer, int]:
        """Sends until the answer is neither 503 nor 429 (after Retry-After, with jitter),
        up to MAX_ATTEMPTS or the deadline. Returns the first and last answers and the
        number of attempts. With `others`, a retry may go to another process."""
        target = self
        first = last = target.once(method, path, route, body, headers)
        attempts = 1
        while last.status in (429, 503) and attempts < MAX_ATTEMPTS:
            try:
                pause = float(last.headers.get("retry-after", "1"))
            except ValueError:
                pause = 1.0
            pause = min(pause, 5.0) + random.uniform(0, 0.3)
            if deadline is not None and time.monotonic() + pause > deadline:
                break
            if self.stopping is not None and self.stopping.is_set():
                break
            time.sleep(pause)
            with self.h.lock:
                self.h.client_retries += 1
            if others:
                target = random.choice(others)
            last = target.once(method, path, route, body, headers)
            attempts += 1
        return first, last, attempts

    def path(self, op: str, **query: Any) -> str:
        q = {k: v for k, v in query.items() if v is not None}
        return f"/v1/topics/{self.topic}/{op}" + ("?" + urllib.parse.urlencode(q) if q else "")


# --- the workload --------------------------------------------------------------------------


def new_uid() -> str:
    return uuid.uuid4().hex[:16]


class Workload:
    def __init__(self, nodes: list[Narad], history: History, seed: int, stop: threading.Event,
                 end: float) -> None:
        self.nodes = nodes
        self.h = history
        self.seed = seed
        self.stop = stop
        self.end = end  # hard deadline for retries of in-flight work

    def producer(self, node: Narad, n: int) -> None:
        rng = random.Random(f"{self.seed}/producer/{node.index}/{n}")
        while not self.stop.is_set():
            r = rng.random()
            if r < 0.35:
                self.produce_one(node, rng, keyed=False)
            elif r < 0.6:
                self.produce_one(node, rng, keyed=True)
            else:
                self.produce_batch(node, rng)
            time.sleep(rng.uniform(0.05, 0.3))

    def produce_one(self, node: Narad, rng: random.Random, keyed: bool) -> None:
        s = Sent(new_uid(), f"k-{new_uid()}" if keyed else None, "POST produce")
        with self.h.lock:
            self.h.sent.append(s)
        headers = {"Content-Type": "application/json"}
        if s.idem_key:
            headers["Idempotency-Key"] = s.idem_key
        body = json.dumps({"id": s.uid}).encode()
        # Keyless produces are retried after a 503 half the time (then they may land twice).
        retry = keyed or rng.random() < 0.5
        if retry:
            first, last, s.attempts = node.retrying("POST", node.path("produce"), s.route, body, headers,
                                                   deadline=self.end, others=self.nodes if keyed else None)
        else:
            last, s.attempts = node.once("POST", node.path("produce"), s.route, body, headers), 1
        s.status = last.status
        if last.status == 201:
            got = last.json()
            s.partition, s.offset = got["partition"], got["offset"]

    def produce_batch(self, node: Narad, rng: random.Random) -> None:
        batch = []
        for _ in range(rng.randint(2, 6)):
            keyed = rng.random() < 0.5
            batch.append(Sent(new_uid(), f"k-{new_uid()}" if keyed else None, "POST produce-batch"))
        with self.h.lock:
            self.h.sent.extend(batch)
        messages = []
        for s in batch:
            m: dict[str, Any] = {"payload": {"id": s.uid}}
            if s.idem_key:
                m["idempotency_key"] = s.idem_key
            messages.append(m)
        all_keyed = all(s.idem_key for s in batch)
        retry = all_keyed or rng.random() < 0.5
        pending = list(range(len(batch)))
        attempts = 0
        target = node
        while pending:
            attempts += 1
            body = {"messages": [messages[i] for i in pending]}
            ans = target.once("POST", node.path("produce-batch"), "POST produce-batch", body)
            for i in pending:
                batch[i].attempts += 1
            if ans.status == 200:
                results = ans.json()["results"]
                again = []
                for i, res in zip(pending, results):
                    batch[i].status = res["status"]
                    if res["status"] == 201:
                        batch[i].partition, batch[i].offset = res["partition"], res["offset"]
                    elif res["status"] in (429, 503):
                        again.append(i)
                    elif res["status"] == 500:
                        self.h.violation(f"produce-batch entry answered 500: {res}")
            else:
                again = list(pending)
                for i in pending:
                    batch[i].status = ans.status
            if ans.status not in (200, 429, 503) or not again:
                return
            if not retry or attempts >= MAX_ATTEMPTS or time.monotonic() + 1 > self.end or self.stop.is_set():
                return
            try:
                pause = float(ans.headers.get("retry-after", "1")) if ans.status != 200 else 1.0
            except ValueError:
                pause = 1.0
            time.sleep(min(pause, 5.0) + rng.uniform(0, 0.3))
            with self.h.lock:
                self.h.client_retries += 1
            # Only the messages that were not stored go again (as clients/python does).
            pending = again
            target = rng.choice(self.nodes)

    def consumer(self, node: Narad, n: int, sub: str) -> None:
        rng = random.Random(f"{self.seed}/consumer/{node.index}/{n}/{sub}")
        name = f"c{node.index}.{n}{'.' + sub if sub else ''}"
        while not self.stop.is_set():
            batch = rng.random() < 0.3
            deliveries = consume(node, self.h, sub, name, wait="1s", max_=rng.randint(2, 5) if batch else None)
            if not deliveries:
                time.sleep(rng.uniform(0.05, 0.2))
                continue
            if batch and len(deliveries) > 1 and rng.random() < 0.5:
                settle_batch(node, self.h, deliveries, self.end)
                continue
            for d in deliveries:
                r = rng.random()
                if r < 0.07:
                    # Hold past the lease: the ack should be 410 and the message come back.
                    time.sleep(VISIBILITY_MS / 1000 + rng.uniform(0.3, 1.0))
                    settle(node, self.h, d, "ack", self.end)
                elif r < 0.17:
                    settle(node, self.h, d, "nack", self.end)
                elif r < 0.30:
                    if settle(node, self.h, d, "extend", self.end) == 204:
                        time.sleep(rng.uniform(0.2, 1.0))
                    settle(node, self.h, d, "ack", self.end)
                else:
                    settle(node, self.h, d, "ack", self.end)


def consume(node: Narad, h: History, sub: str, consumer: str, wait: str | None,
            max_: int | None) -> list[Delivery]:
    ans = node.once("GET", node.path("consume", wait=wait, max=max_, subscription=sub or None),
                    f"GET consume{'(sub)' if sub else ''}")
    if ans.status != 200:
        return []
    got = ans.json()
    messages = got["messages"] if max_ is not None else [got]
    out = []
    for m in messages:
        payload = m["payload"]
        uid = payload.get("id", "?") if isinstance(payload, dict) else "?"
        d = Delivery(sub, m["partition"], m["offset"], uid, m["delivery_count"], consumer, ans.t0, ans.t1,
                     m["receipt_handle"])
        out.append(d)
    with h.lock:
        h.deliveries.extend(out)
    return out


EXTEND = {"ack": None, "extend": "true", "nack": "0"}


def settle(node: Narad, h: History, d: Delivery, kind: str, deadline: float) -> int:
    path = node.path("ack", receipt_handle=d.handle, extend=EXTEND[kind])
    first, last, attempts = node.retrying("POST", path, f"POST ack({kind})", deadline=deadline)
    with h.lock:
        d.settles.append(Settle(kind, first.t0, last.t1, last.status, first.status, attempts))
    return last.status


def settle_batch(node: Narad, h: History, ds: list[Delivery], deadline: float) -> None:
    """Acks in one request; entries answered 503 are sent again, alone, after a pause."""
    pending = list(ds)
    firsts: dict[int, tuple[float, int]] = {}
    attempts = collections.Counter[int]()
    while pending:
        ans = node.once("POST", node.path("ack"), "POST ack(batch)",
                        {"receipt_handles": [d.handle for d in pending]})
        results = ans.json()["results"] if ans.status == 200 else [{"status": ans.status}] * len(pending)
        again = []
        for d, res in zip(pending, results):
            attempts[id(d)] += 1
            firsts.setdefault(id(d), (ans.t0, res["status"]))
            if res["status"] in (429, 503) and attempts[id(d)] < MAX_ATTEMPTS and time.monotonic() + 1 < deadline:
                again.append(d)
            else:
                t0, first = firsts[id(d)]
                with h.lock:
                    d.settles.append(Settle("ack", t0, ans.t1, res["status"], first, attempts[id(d)]))
        pending = again
        if pending:
            time.sleep(1.0 + random.uniform(0, 0.3))


# --- processes -----------------------------------------------------------------------------


class Cluster:
    def __init__(self, args: argparse.Namespace, seed: int, workdir: str) -> None:
        self.args = args
        self.seed = seed
        self.workdir = workdir
        self.proxy: subprocess.Popen[str] | None = None
        self.servers: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.control = 0

    def start(self) -> None:
        a = self.args
        cmd = [sys.executable, os.path.join(HERE, "proxy.py"), "--upstream", a.endpoint,
               "--processes", str(PROCESSES), "--seed", str(self.seed), "--rate", str(a.rate),
               "--profile", a.profile, "--target-rate", str(a.target_rate),
               "--hold-min", str(a.hold_min), "--hold-max", str(a.hold_max)]
        self.proxy = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proxy.stdout is not None
        line = self.proxy.stdout.readline()
        if not line:
            raise SystemExit("the fault proxy did not start")
        info = json.loads(line)
        self.control = info["control"]
        prefix = f"s3-faults/{a.label}-{int(time.time())}-{os.getpid()}-{self.seed}"
        for i, port in enumerate(info["ports"]):
            listen = free_port()
            env = {
                **os.environ,
                "NARAD_STORE": f"s3://{a.bucket}/{prefix}",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                "AWS_ACCESS_KEY_ID": a.access_key,
                "AWS_SECRET_ACCESS_KEY": a.secret_key,
                "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true",
                "NARAD_LISTEN": f"127.0.0.1:{listen}",
                "NARAD_AUTH": "faults:faults-pass",
                "NARAD_RECEIPT_KEY": "s3-faults-receipt-key-0123456789",
                "NARAD_POLL_INTERVAL_MS": "100",
                "NARAD_IDLE_POLL_MAX_MS": "500",
                "NARAD_LOG": os.environ.get("NARAD_S3_FAULT_LOG", "warn"),
            }
            env.pop("AWS_ENDPOINT_URL_S3", None)
            log = open(os.path.join(self.workdir, f"narad-{i}.log"), "wb")
            self.servers.append(subprocess.Popen([a.narad, "serve"], env=env, stdout=log, stderr=log))
            self.urls.append(f"http://127.0.0.1:{listen}")
        deadline = time.monotonic() + 90
        for i, url in enumerate(self.urls):
            while True:
                if self.servers[i].poll() is not None:
                    raise SystemExit(f"narad {i} exited at startup:\n{self.log_tail(i)}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"narad {i} did not answer /health in 90 s:\n{self.log_tail(i)}")
                time.sleep(0.2)

    def log_tail(self, i: int, lines: int = 12) -> str:
        """The last distinct lines of narad i's log, each cut to 400 characters."""
        try:
            with open(os.path.join(self.workdir, f"narad-{i}.log"), errors="replace") as f:
                distinct = list(dict.fromkeys(line.rstrip()[:400] for line in f))
            return "\n".join(distinct[-lines:])
        except OSError:
            return ""

    def log_summary(self, i: int) -> str:
        """How many WARN and ERROR lines narad i logged, and its distinct ERROR lines."""
        try:
            with open(os.path.join(self.workdir, f"narad-{i}.log"), errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return "unreadable"
        warns = sum(" WARN " in line for line in lines)
        errors = list(dict.fromkeys(line.split(" ERROR ", 1)[1].strip()[:300] for line in lines if " ERROR " in line))
        return f"{warns} WARN lines, {len(errors)} distinct ERROR lines" + "".join(f"\n    {e}" for e in errors[:5])

    def faults(self, on: bool | None) -> dict:
        method, path = ("GET", "/stats") if on is None else ("POST", "/faults/on" if on else "/faults/off")
        req = urllib.request.Request(f"http://127.0.0.1:{self.control}{path}", method=method,
                                     data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        for p in self.servers:
            if p.poll() is None:
                p.terminate()
        for p in self.servers:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.proxy is not None and self.proxy.poll() is None:
            assert self.proxy.stdin is not None
            self.proxy.stdin.close()
            try:
                self.proxy.wait(5)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait(5)


# --- drain, replay, checks -----------------------------------------------------------------


def drain(nodes: list[Narad], h: History, partitions: int, deadline: float) -> tuple[bool, str]:
    """Consumes and acks everything left, on the topic and the subscription, until the
    figures show nothing unsettled. Returns whether it got there, and the last figures."""
    time.sleep(VISIBILITY_MS / 1000 + 0.5)  # leases taken before the stop lapse
    figures = ""
    while time.monotonic() < deadline:
        for sub in ("", SUB):
            empty_rounds = 0
            while empty_rounds < 2 and time.monotonic() < deadline:
                got = 0
                for node in nodes:
                    ds = consume(node, h, sub, "drain", wait=None, max_=100)
                    got += len(ds)
                    if ds:
                        settle_batch(node, h, ds, deadline)
                empty_rounds = 0 if got else empty_rounds + 1
        ans = nodes[0].once("GET", f"/v1/topics/{nodes[0].topic}", "GET topic")
        sub_ans = nodes[0].once("GET", f"/v1/topics/{nodes[0].topic}/subscriptions/{SUB}", "GET subscription")
        if ans.status == 200 and sub_ans.status == 200:
            parts = ans.json()["partitions"] + sub_ans.json()["partitions"]
            figures = json.dumps([{k: p[k] for k in ("partition", "frontier", "next_offset", "available",
                                                      "in_flight", "delayed")} for p in parts])
            if all(p["available"] == 0 and p["in_flight"] == 0 and p["delayed"] == 0 for p in parts):
                return True, figures
        time.sleep(0.5)
    return False, figures


def replay(nodes: list[Narad], h: History) -> dict[tuple[int, int], str]:
    """Every retained offset of every partition, read back: (partition, offset) -> payload id."""
    ans = nodes[0].once("GET", f"/v1/topics/{nodes[0].topic}", "GET topic")
    parts = ans.json()["partitions"]
    wanted = [(p["partition"], o) for p in parts for o in range(p["start_offset"], p["next_offset"])]
    stored: dict[tuple[int, int], str] = {}
    void: list[tuple[int, int]] = []
    lock = threading.Lock()

    def reader(i: int) -> None:
        node = nodes[i % len(nodes)]
        for p, o in wanted[i::len(nodes)]:
            a = node.once("GET", node.path("consume", partition=p, offset=o), "GET replay")
            if a.status == 404 and b"message_not_found" in a.body:
                # A void offset: its segment, written beside its manifest write, was never
                # stored, and its produces were refused (design.md §6). An acknowledged
                # produce there is still a violation (check: it is not where it was told).
                with lock:
                    void.append((p, o))
                continue
            if a.status != 200:
                h.violation(f"replay of partition {p} offset {o} answered {a.status}: {a.body[:200]!r}")
                continue
            payload = a.json()["payload"]
            with lock:
                stored[(p, o)] = payload.get("id", "?") if isinstance(payload, dict) else repr(payload)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    h.void_offsets = len(void)
    return stored


def check(h: History, stored: dict[tuple[int, int], str], drained: bool) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    by_uid: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for pos, uid in sorted(stored.items()):
        by_uid[uid].append(pos)
    sent = {s.uid: s for s in h.sent}
    delivered: dict[str, set[str]] = collections.defaultdict(set)  # uid -> subscriptions
    for d in h.deliveries:
        delivered[d.uid].add(d.sub)

    # Acknowledged produces: retained where they were told, and delivered.
    for s in h.sent:
        if s.status != 201:
            continue
        counts["produces acknowledged"] += 1
        got = stored.get((s.partition, s.offset))  # type: ignore[arg-type]
        if got != s.uid:
            h.violation(f"produce {s.uid} ({s.route}, key {s.idem_key}) answered 201 at "
                        f"{s.partition}/{s.offset}, which holds {got!r}")
        for sub in ("", SUB):
            if drained and sub not in delivered[s.uid]:
                h.violation(f"produce {s.uid} answered 201 at {s.partition}/{s.offset} was never "
                            f"delivered on {'the subscription ' + SUB if sub else 'the topic'}")

    # Stored twice.
    counts["offsets replayed"] = len(stored)
    counts["void offsets (segments never stored, their produces refused)"] = h.void_offsets
    for uid, positions in by_uid.items():
        s = sent.get(uid)
        if s is None:
            h.violation(f"offsets {positions} hold payload {uid!r}, which no producer sent")
            continue
        if len(positions) > 1:
            counts["messages stored twice"] += 1
            if s.idem_key is None and s.attempts > 1:
                counts["stored twice, allowed (keyless, sent again)"] += 1
            else:
                h.violation(f"message {uid} ({s.route}, idempotency key {s.idem_key}, sent "
                            f"{s.attempts} time(s), answered {s.status} at {s.partition}/{s.offset}) "
                            f"is stored at {positions}")

    # Per message and subscription: acks, leases.
    per_msg: dict[tuple[str, int, int], list[Delivery]] = collections.defaultdict(list)
    for d in h.deliveries:
        per_msg[(d.sub, d.partition, d.offset)].append(d)
    margin = 0.05
    vis = VISIBILITY_MS / 1000
    for (sub, p, o), ds in per_msg.items():
        where = f"{'sub ' + SUB if sub else 'topic'} {p}/{o}"
        ds.sort(key=lambda d: (d.count, d.t0))
        counts["deliveries"] += len(ds)
        # A message acked 204 is never delivered again after that answer.
        for d in ds:
            for st in d.settles:
                counts[f"settles {st.kind} {st.status}"] += 1
                if st.kind == "ack" and st.status == 204:
                    for e in ds:
                        if e.t0 > st.t1:
                            h.violation(f"{where}: acked 204 (delivery {d.count} to {d.consumer}, answered at "
                                        f"{at(st.t1)}), delivered again (delivery {e.count} to {e.consumer}, "
                                        f"asked at {at(e.t0)})")
        # No two live leases: a later delivery answered while an earlier lease must be live.
        for i, a in enumerate(ds):
            live_until = a.t0 + vis
            for st in a.settles:
                if st.kind == "extend" and st.status == 204:
                    live_until = max(live_until, st.t0 + vis)
            for st in a.settles:
                if st.kind in ("ack", "nack"):
                    live_until = min(live_until, st.t0)
            for b in ds[i + 1:]:
                if b.count > a.count and b.t1 + margin < live_until and b.t0 > a.t1:
                    h.violation(f"{where}: two live leases: delivery {a.count} to {a.consumer} (live until "
                                f"at least {at(live_until)}), delivery {b.count} to {b.consumer} answered at "
                                f"{at(b.t1)}")
            if any(b.count == a.count for b in ds[i + 1:]):
                counts["deliveries with a repeated delivery_count"] += 1
        # A landed ack answered 410: the lease acked was the last one, yet the drain found
        # nothing left, so this ack settled it.
        last = ds[-1]
        for st in last.settles:
            if st.kind == "ack" and st.first_status == 410 and st.attempts == 1:
                counts["acks 410 at the first attempt on the last lease"] += 1
                later = [e for e in ds if e.t0 > last.t1]
                if drained and not later:
                    h.violation(f"{where}: ack answered 410 but it landed (delivery {last.count} to "
                                f"{last.consumer} answered at {at(last.t1)}, ack sent at {at(st.t0)}, answered at "
                                f"{at(st.t1)}): the message was never delivered again and the drain left "
                                f"nothing unsettled")
    return dict(counts)


def dump_history(path: str, h: History, stored: dict[tuple[int, int], str]) -> None:
    def rel(d: dict) -> dict:
        return {k: (round(v - START, 3) if k in ("t0", "t1") else v) for k, v in d.items()}

    out = {
        "sent": [s.__dict__ for s in h.sent],
        "deliveries": [{**rel({k: v for k, v in d.__dict__.items() if k != "settles"}),
                        "settles": [rel(st.__dict__) for st in d.settles]} for d in h.deliveries],
        "stored": {f"{p}/{o}": uid for (p, o), uid in sorted(stored.items())},
    }
    with open(path, "w") as f:
        json.dump(out, f)


# --- main ----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--narad", default="target/debug/narad", help="the narad binary")
    ap.add_argument("--endpoint", default="127.0.0.1:4566", help="HOST:PORT of the S3 store")
    ap.add_argument("--access-key", default="test")
    ap.add_argument("--secret-key", default="test")
    ap.add_argument("--bucket", default="narad-test")
    ap.add_argument("--label", default="store", help="names the run in its output and its key prefix")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=0.06, help="chance of a random fault per storage request")
    ap.add_argument("--profile", choices=("random", "targeted", "mixed"), default="mixed")
    ap.add_argument("--target-rate", type=float, default=0.3)
    ap.add_argument("--hold-min", type=float, default=4.0)
    ap.add_argument("--hold-max", type=float, default=12.0)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None, help="default: NARAD_S3_FAULT_SEED, else random")
    ap.add_argument("--keep-logs", action="store_true", help="keep the narad logs' directory")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(os.environ.get("NARAD_S3_FAULT_SEED") or random.randrange(1, 10**6))
    random.seed(seed)
    print(f"[{a.label}] seed {seed} (replay: NARAD_S3_FAULT_SEED={seed}); profile {a.profile}, random fault "
          f"rate {a.rate}, {a.seconds:.0f} s, {a.partitions} partition(s), store {a.endpoint}", flush=True)
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="narad-s3-faults-")
    cluster = Cluster(a, seed, workdir)
    h = History()
    try:
        cluster.start()
        topic = f"faults-{seed}"
        nodes = [Narad(i, url, "faults:faults-pass", h, topic) for i, url in enumerate(cluster.urls)]
        ans = nodes[0].once("PUT", f"/v1/topics/{topic}", "PUT topic",
                            {"partitions": a.partitions, "visibility_timeout_ms": VISIBILITY_MS})
        if ans.status not in (200, 201):
            raise SystemExit(f"creating the topic answered {ans.status}: {ans.body!r}")
        ans = nodes[1].once("PUT", f"/v1/topics/{topic}/subscriptions/{SUB}", "PUT subscription", {})
        if ans.status not in (200, 201):
            raise SystemExit(f"creating the subscription answered {ans.status}: {ans.body!r}")
        print(f"[{a.label}] 3 processes up in {time.monotonic() - started:.1f} s; faults on", flush=True)

        stop = threading.Event()
        work = Workload(nodes, h, seed, stop, time.monotonic() + a.seconds + 40)
        for node in nodes:
            node.stopping = stop
        threads = []
        for node in nodes:
            for n in range(2):
                threads.append(threading.Thread(target=work.producer, args=(node, n), daemon=True))
                threads.append(threading.Thread(target=work.consumer, args=(node, n, ""), daemon=True))
            threads.append(threading.Thread(target=work.consumer, args=(node, 0, SUB), daemon=True))
        cluster.faults(True)
        for t in threads:
            t.start()
        time.sleep(a.seconds)
        stop.set()
        stopped = time.monotonic()
        for t in threads:
            t.join(max(1.0, work.end - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        if stuck:
            h.violation(f"{stuck} workload thread(s) still busy {work.end - started:.0f} s after the start")
        print(f"[{a.label}] workload stopped; its last requests took {time.monotonic() - stopped:.1f} s more",
              flush=True)
        faults = cluster.faults(False)
        for i, p in enumerate(cluster.servers):
            if p.poll() is not None:
                h.violation(f"narad {i} exited with {p.returncode}:\n{cluster.log_tail(i)}")
        load_done = time.monotonic()

        drained, figures = drain(nodes, h, a.partitions, time.monotonic() + 60)
        if not drained:
            h.violation(f"the drain did not settle everything in 60 s: {figures}")
        stored = replay(nodes, h)
        counts = check(h, stored, drained)
        if a.keep_logs:
            dump_history(os.path.join(workdir, "history.json"), h, stored)
        took = time.monotonic() - started

        print(f"[{a.label}] faults injected: {faults['faults_total']} of the {faults['requests_while_on']} storage "
              f"requests while faults were on ({100 * faults['faults_total'] / max(1, faults['requests_while_on']):.1f} %): "
              f"{json.dumps(faults['faults'], sort_keys=True)}; storage requests {json.dumps(faults['requests'], sort_keys=True)}"
              f"; upstream errors {faults['upstream_errors']}, requests sent again on a fresh connection {faults['upstream_retries']}")
        for kind, distances in sorted(faults["recoveries"].items()):
            over = [d for d in distances if d >= 16]
            print(f"[{a.label}] conditional manifest/ledger writes applied but answered '{kind}': "
                  f"{len(distances)}; other processes' commits before the writer's next read of the object: max "
                  f"{max(distances, default=0)}, {len(over)} at 16 or more {over}")
        holds = faults["holds"]
        if holds:
            reads = [x["other_commits_before_read"] for x in holds if x["other_commits_before_read"] is not None]
            print(f"[{a.label}] targeted holds: {len(holds)}; other processes' commits before the held "
                  f"recovery read: {sorted(reads)}; reads held: {sum(1 for x in holds if x['gets_held'])}")
            for x in holds:
                print(f"    {json.dumps(x)}")
        print(f"[{a.label}] narad answers by route and status:")
        for k, v in sorted(h.answers.items()):
            print(f"    {k}: {v}")
        print(f"[{a.label}] client retries after 503/429: {h.client_retries}")
        print(f"[{a.label}] checked: {json.dumps(counts, sort_keys=True)}")
        print(f"[{a.label}] load {load_done - started:.0f} s, drain and checks {took - (load_done - started):.0f} s, "
              f"total {took:.0f} s")
        if h.violations:
            print(f"[{a.label}] FAILED: {len(h.violations)} violation(s) (seed {seed}):")
            for v in h.violations[:100]:
                print(f"  - {v}")
            for i in range(len(cluster.servers)):
                print(f"[{a.label}] narad {i} log: {cluster.log_summary(i)}")
            return 1
        if faults["faults_total"] < 0.05 * faults["requests_while_on"] and a.rate >= 0.05:
            print(f"[{a.label}] FAILED: fewer faults than 5 % of requests")
            return 1
        print(f"[{a.label}] ok: no violation (seed {seed})")
        return 0
    finally:
        cluster.stop()
        if not a.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"[{a.label}] logs in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
