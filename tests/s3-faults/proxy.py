#!/usr/bin/env python3
"""A seeded HTTP fault proxy between `narad serve` processes and an S3 store.

It listens on one port per narad process (so it knows which process sent a request) and
forwards every request unchanged, byte for byte (the Host header included: SeaweedFS checks
SigV4 signatures), to one upstream store. While faults are on (they start off; the control
port turns them on), each request draws from the process's own seeded RNG and, at the
configured rate, gets one fault:

- ``lost``: forwarded and applied by the store, then the connection is dropped unanswered;
- ``slowdown``: answered 503 SlowDown (S3's XML error body) without being forwarded;
- ``error500``: forwarded and applied, then answered 500 InternalError instead;
- ``reset``: the connection is reset before anything is forwarded;
- ``slow``: held 0.2-2 s, then forwarded.

The targeted case (profiles ``targeted`` and ``mixed``): a conditional PUT (If-Match or
If-None-Match) of a partition manifest (``...manifest.json``) or a subscription ledger
(``.../subs/S/ID/P.json``) gets a lost answer with probability ``--target-rate`` whenever no
other hold is running, and then that process's GETs of that key are held for
``--hold-min``..``--hold-max`` seconds while the other processes keep committing. The
writer's recovery read (docs/design.md §3, lost-response recovery) thus comes after many
other commits; the proxy counts the other processes' successful conditional PUTs of the key
in between and reports them per hold.

Decisions come from ``random.Random(f"{seed}/{process}")``, one draw sequence per process,
so a seed replays the same decisions for the same request sequence (the interleaving of
processes still depends on timing).

Usage (the driver, run.py, starts it):

    proxy.py --upstream 127.0.0.1:4566 --processes 3 --seed 7 --rate 0.06 --profile mixed

It prints one JSON line on stdout once listening: {"ports": [...], "control": PORT}.
Control port: ``GET /stats`` (JSON counts), ``POST /faults/on``, ``POST /faults/off``.
Standard library only (Python 3.11).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import re
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

# A partition manifest (layout 1 and 2) or a subscription ledger: the objects changed by CAS
# with write ids.
TARGET_KEY = re.compile(r"(manifest\.json|/subs/[^/]+/[^/]+/\d+\.json)$")
KINDS = ("lost", "slowdown", "error500", "reset", "slow")
# Relative weights of the random faults.
WEIGHTS = (30, 20, 15, 15, 20)
MAX_HEAD = 64 * 1024
IO_TIMEOUT = 60.0


class Closed(Exception):
    """The peer closed the connection before a whole message arrived."""


@dataclass
class Message:
    """One HTTP/1.1 request or response, kept as the exact bytes that arrived."""

    start: str  # request line or status line
    headers: dict[str, str]  # lower-cased names (last value wins); for decisions only
    raw: bytes  # head and body exactly as received
    framed: bool = True  # its end was known without the connection closing

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


async def read_head(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise Closed() from e
    except asyncio.LimitOverrunError as e:
        raise Closed() from e
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers, head


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str], until_eof: bool) -> bytes:
    """The body's raw bytes, framed by Content-Length, chunked encoding, or (responses
    only) the end of the connection."""
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size_line = await reader.readuntil(b"\r\n")
                parts.append(size_line)
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    while True:  # trailers, then the empty line
                        line = await reader.readuntil(b"\r\n")
                        parts.append(line)
                        if line == b"\r\n":
                            return b"".join(parts)
                parts.append(await reader.readexactly(size + 2))
        if "content-length" in headers:
            return await reader.readexactly(int(headers["content-length"]))
        if until_eof:
            return await reader.read()
        return b""
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        raise Closed() from e


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Message | None:
    got = await read_head(reader)
    if got is None:
        return None
    start, headers, head = got
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = await read_body(reader, headers, until_eof=False)
    return Message(start, headers, head + body)


async def read_response(reader: asyncio.StreamReader, method: str) -> Message:
    while True:
        got = await read_head(reader)
        if got is None:
            raise Closed()
        start, headers, head = got
        parts = start.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if 100 <= status < 200:
            continue  # an interim answer (100 Continue): the client was answered already
        if method == "HEAD" or status in (204, 304):
            return Message(start, headers, head)
        body = await read_body(reader, headers, until_eof=True)
        framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        return Message(start, headers, head + body, framed)


def s3_error(status: int, code: str, message: str) -> bytes:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>narad-fault-proxy</RequestId></Error>"
    ).encode()
    reason = {500: "Internal Server Error", 503: "Slow Down"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nx-amz-request-id: narad-fault-proxy\r\n\r\n"
    )
    return head.encode() + body


def reset(writer: asyncio.StreamWriter) -> None:
    """Closes with a TCP RST (SO_LINGER 0) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.close()


@dataclass
class Hold:
    """The targeted case: process `proc`'s GETs of `key` wait until `until`."""

    proc: int
    key: str
    method: str
    started: float
    until: float
    lost_status: int = 0  # what the store answered the lost PUT
    other_commits: int = 0  # other processes' 2xx conditional PUTs of `key` since the loss
    commits_before_read: int | None = None  # the same, when the first held GET was let go
    gets_held: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def report(self) -> dict:
        return {
            "process": self.proc,
            "key": self.key.rsplit("/topics/", 1)[-1],
            "lost_status": self.lost_status,
            "hold_s": round(self.until - self.started, 2),
            "gets_held": self.gets_held,
            "other_commits_before_read": self.commits_before_read,
            "other_commits_during_hold": self.other_commits,
        }


@dataclass
class Recovery:
    """A conditional manifest or ledger PUT that the store applied and whose answer the
    process never saw (lost, or replaced by a 500): the other processes' commits of the key
    until that process reads the key again (its recovery read, docs/design.md §3)."""

    kind: str
    other_commits: int = 0


@dataclass
class Config:
    upstream: tuple[str, int]
    processes: int
    seed: int
    rate: float
    profile: str
    target_rate: float
    hold_min: float
    hold_max: float
    hold_gap: float


class Proxy:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rngs = [random.Random(f"{cfg.seed}/{p}") for p in range(cfg.processes)]
        self.faults_on = False
        self.faults: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.upstream_errors = 0
        self.requests_faulty = 0  # requests while faults were on
        self.upstream_retries = 0  # requests sent again after a kept connection failed
        self.holds: list[Hold] = []
        self.active: dict[int, Hold] = {}
        self.last_hold_end = 0.0
        self.recovering: dict[tuple[int, str], Recovery] = {}
        # Other processes' commits before each recovery read, by fault kind.
        self.recovered: dict[str, list[int]] = collections.defaultdict(list)

    # --- decisions -------------------------------------------------------------------

    def choose(self, proc: int, method: str, key: str, headers: dict[str, str]) -> str | None:
        """The fault for one request, or None. Always draws the same number of values per
        request so that a process's sequence of decisions depends only on its requests."""
        rng = self.rngs[proc]
        draw_fault, draw_kind, draw_target = rng.random(), rng.random(), rng.random()
        if not self.faults_on:
            return None
        conditional = method == "PUT" and ("if-match" in headers or "if-none-match" in headers)
        if (
            self.cfg.profile in ("targeted", "mixed")
            and conditional
            and TARGET_KEY.search(key)
            and draw_target < self.cfg.target_rate
            and self.can_hold(proc)
        ):
            return "lost+hold"
        if self.cfg.profile == "targeted" and self.cfg.rate == 0:
            return None
        if draw_fault >= self.cfg.rate:
            return None
        total = sum(WEIGHTS)
        point = draw_kind * total
        for kind, weight in zip(KINDS, WEIGHTS):
            if point < weight:
                return kind
            point -= weight
        return KINDS[-1]

    def can_hold(self, proc: int) -> bool:
        # One process held at a time, so the others keep committing.
        return not self.active and time.monotonic() - self.last_hold_end >= self.cfg.hold_gap

    def start_hold(self, proc: int, method: str, key: str) -> Hold:
        rng = self.rngs[proc]
        now = time.monotonic()
        hold = Hold(proc, key, method, now, now + rng.uniform(self.cfg.hold_min, self.cfg.hold_max))
        self.active[proc] = hold
        self.holds.append(hold)
        asyncio.get_running_loop().create_task(self.end_hold(hold))
        return hold

    async def end_hold(self, hold: Hold) -> None:
        try:
            await asyncio.wait_for(hold.released.wait(), hold.until - time.monotonic())
        except TimeoutError:
            pass
        hold.released.set()
        if self.active.get(hold.proc) is hold:
            del self.active[hold.proc]
        self.last_hold_end = time.monotonic()

    async def wait_if_held(self, proc: int, method: str, key: str) -> bool:
        hold = self.active.get(proc)
        if hold is None or method not in ("GET", "HEAD") or key != hold.key:
            return False
        hold.gets_held += 1
        await hold.released.wait()
        if hold.commits_before_read is None:
            hold.commits_before_read = hold.other_commits
        return True

    def saw_answer(self, proc: int, method: str, key: str, headers: dict[str, str], status: int,
                   fault: str | None) -> None:
        if method == "GET" and (200 <= status < 300 or status == 304) and fault in (None, "slow"):
            rec = self.recovering.pop((proc, key), None)
            if rec is not None:
                self.recovered[rec.kind].append(rec.other_commits)
        if method != "PUT" or not 200 <= status < 300:
            return
        if "if-match" not in headers and "if-none-match" not in headers:
            return
        if fault in ("lost", "lost+hold", "error500") and TARGET_KEY.search(key):
            self.recovering[(proc, key)] = Recovery(fault)
            return
        for (p, k), rec in self.recovering.items():
            if k == key and p != proc:
                rec.other_commits += 1
        for hold in self.active.values():
            if hold.key == key and hold.proc != proc:
                hold.other_commits += 1

    # --- connections -----------------------------------------------------------------

    async def serve(self, proc: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                req = await asyncio.wait_for(read_request(reader, writer), 300)
                if req is None:
                    return
                method, target = (req.start.split(" ") + ["", ""])[:2]
                key = target.split("?", 1)[0]
                self.requests[f"{method}"] += 1
                if self.faults_on:
                    self.requests_faulty += 1
                if await self.wait_if_held(proc, method, key):
                    fault = None  # the recovery read itself goes through cleanly
                else:
                    fault = self.choose(proc, method, key, req.headers)
                if fault is not None:
                    self.faults[fault] += 1
                if fault == "reset":
                    reset(writer)
                    return
                if fault == "slowdown":
                    writer.write(s3_error(503, "SlowDown", "Please reduce your request rate."))
                    await writer.drain()
                    continue
                if fault == "slow":
                    await asyncio.sleep(self.rngs[proc].uniform(0.2, 2.0))
                up, resp = await self.forward(up, req, method)
                if resp is None:
                    self.upstream_errors += 1
                    reset(writer)
                    return
                status = int(resp.start.split(" ", 2)[1])
                self.saw_answer(proc, method, key, req.headers, status, fault)
                if fault == "lost+hold":
                    hold = self.start_hold(proc, method, key)
                    hold.lost_status = status
                if fault in ("lost", "lost+hold"):
                    reset(writer)
                    return
                if fault == "error500":
                    writer.write(s3_error(500, "InternalError", "We encountered an internal error."))
                else:
                    writer.write(resp.raw)
                await writer.drain()
                if resp.header("connection") == "close":
                    return
        except (Closed, ConnectionError, TimeoutError, OSError):
            pass
        finally:
            if up is not None:
                up[1].close()
            if not writer.is_closing():
                writer.close()

    async def forward(
        self,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
        req: Message,
        method: str,
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None, Message | None]:
        """Sends `req` upstream on the connection kept for this client connection. A reused
        connection the store closed while idle is replaced once, before any answer byte."""
        for fresh in (up is None, True):
            if fresh:
                if up is not None:
                    up[1].close()
                try:
                    up = await asyncio.wait_for(
                        asyncio.open_connection(*self.cfg.upstream, limit=MAX_HEAD * 16), 5
                    )
                except (OSError, TimeoutError):
                    return None, None
                sock = up[1].get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            assert up is not None
            try:
                up[1].write(req.raw)
                await up[1].drain()
                resp = await asyncio.wait_for(read_response(up[0], method), IO_TIMEOUT)
            except (Closed, ConnectionError, OSError):
                if fresh:
                    up[1].close()
                    return None, None
                self.upstream_retries += 1
                continue
            except TimeoutError:
                up[1].close()
                return None, None
            if resp.header("connection") == "close" or not resp.framed:
                up[1].close()
                up = None
            return up, resp
        return None, None

    # --- control ---------------------------------------------------------------------

    def stats(self) -> dict:
        return {
            "seed": self.cfg.seed,
            "profile": self.cfg.profile,
            "rate": self.cfg.rate,
            "faults_on": self.faults_on,
            "requests": dict(self.requests),
            "requests_total": sum(self.requests.values()),
            "requests_while_on": self.requests_faulty,
            "faults": dict(self.faults),
            "faults_total": sum(self.faults.values()),
            "upstream_errors": self.upstream_errors,
            "upstream_retries": self.upstream_retries,
            "holds": [h.report() for h in self.holds],
            "recoveries": {k: sorted(v) for k, v in self.recovered.items()},
        }

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = await asyncio.wait_for(read_request(reader, writer), 10)
            if req is None:
                return
            method, target = (req.start.split(" ") + ["", ""])[:2]
            if method == "POST" and target == "/faults/on":
                self.faults_on = True
            elif method == "POST" and target == "/faults/off":
                self.faults_on = False
                for hold in list(self.active.values()):
                    hold.released.set()
            body = json.dumps(self.stats()).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (Closed, ConnectionError, TimeoutError, OSError):
            pass
        finally:
            writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the S3 store")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--rate", type=float, default=0.06, help="chance of a random fault per request")
    ap.add_argument("--profile", choices=("random", "targeted", "mixed"), default="mixed")
    ap.add_argument("--target-rate", type=float, default=0.3,
                    help="chance that a conditional manifest or ledger PUT gets a lost answer and a hold, when none runs")
    ap.add_argument("--hold-min", type=float, default=4.0)
    ap.add_argument("--hold-max", type=float, default=12.0)
    ap.add_argument("--hold-gap", type=float, default=1.0, help="seconds between one hold's end and the next")
    a = ap.parse_args()
    host, port = a.upstream.rsplit(":", 1)
    cfg = Config((host, int(port)), a.processes, a.seed, a.rate, a.profile, a.target_rate,
                 a.hold_min, a.hold_max, a.hold_gap)
    proxy = Proxy(cfg)
    servers = []
    for p in range(cfg.processes):
        servers.append(await asyncio.start_server(
            lambda r, w, p=p: proxy.serve(p, r, w), "127.0.0.1", 0, limit=MAX_HEAD * 16))
    control = await asyncio.start_server(proxy.control, "127.0.0.1", 0)
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps({"ports": ports, "control": control.sockets[0].getsockname()[1]}), flush=True)
    # Runs until the driver closes our stdin (or kills us).
    loop = asyncio.get_running_loop()
    stdin_closed = loop.create_future()

    def watch_stdin() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stdin_closed.set_result, None)

    loop.run_in_executor(None, watch_stdin)
    await stdin_closed


if __name__ == "__main__":
    asyncio.run(main())
