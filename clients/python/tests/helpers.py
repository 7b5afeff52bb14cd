"""Running worker scripts as subprocesses, with their output readable line by line, and a
proxy that answers 503 on purpose."""

from __future__ import annotations

import http.server
import json
import urllib.error
import urllib.parse
import urllib.request

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "worker.py"


class Proc:
    """A Python script in a subprocess; stdout lines go to a queue, stderr is collected."""

    def __init__(self, script: Path, args: Sequence[str], env: dict) -> None:
        self.p = subprocess.Popen(
            [sys.executable, str(script), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.out: List[str] = []
        self.err: List[str] = []
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump_out(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.out.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def _pump_err(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.err.append(line)

    def expect(self, text: str, timeout: float) -> str:
        """Waits for a stdout line containing ``text``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line with {text!r} in {timeout}s; stdout {self.out}; stderr {''.join(self.err)}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if text in line:
                return line

    def stderr(self) -> str:
        return "".join(self.err)

    def stop(self, sig: int, timeout: float) -> Optional[int]:
        self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


FORWARDED_HEADERS = ("authorization", "content-type", "idempotency-key")


class FaultyProxy:
    """Forwards to ``upstream``, but answers 503 (``Retry-After``, JSON error body) to the
    first ``failures`` requests whose path ends with ``suffix`` (extends excepted). Logs
    (path, status) of those."""

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
                parts = urllib.parse.urlsplit(self.path)
                path = parts.path
                # Heartbeats (POST .../ack?extend=true) are not acks: forwarded, not logged.
                watched = path.endswith(proxy.suffix) and "extend=" not in parts.query
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
