#!/usr/bin/env python3
"""A Lambda runtime API for ONE execution environment that serves concurrent invocations,
as Lambda Managed Instances do, for measuring narad-api locally (docs/lambda.md).

cargo lambda's emulator (1.9) hands an environment one invocation at a time, like classic
Lambda; with Managed Instances one environment takes up to AWS_LAMBDA_MAX_CONCURRENCY
invocations at once, and `lambda_http::run_concurrent` polls `/next` that many times in
parallel. This script implements just enough of both sides to show what that changes:

- the runtime API (`/2018-06-01/runtime/invocation/next`, `.../{id}/response`,
  `.../{id}/error`, `/2018-06-01/runtime/init/error`), where any number of `/next` calls
  may wait at once and each gets the next queued invocation;
- an HTTP front on another port that turns each request into an API Gateway HTTP API
  (payload 2.0) event, queues it, and answers with the function's response.

It starts the function binary itself, with AWS_LAMBDA_RUNTIME_API pointing here, and
stops it on exit. Standard library only.

Usage: functions/lmi-emulator.py --bin target/release/narad-api --port 9400 \
           --concurrency 32 [--env-file FILE]
"""

import argparse
import base64
import http.server
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

RUNTIME = "/2018-06-01/runtime"


class Invocation:
    def __init__(self, event):
        self.id = str(uuid.uuid4())
        self.event = event
        self.done = threading.Event()
        self.response = None  # (status, headers, body) or None for a function error
        self.error = None


pending = queue.Queue()
inflight = {}
inflight_lock = threading.Lock()


class Runtime(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _body(self):
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    def _reply(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != RUNTIME + "/invocation/next":
            return self._reply(404)
        inv = pending.get()
        with inflight_lock:
            inflight[inv.id] = inv
        body = json.dumps(inv.event).encode()
        self._reply(
            200,
            body,
            {
                "content-type": "application/json",
                "Lambda-Runtime-Aws-Request-Id": inv.id,
                "Lambda-Runtime-Deadline-Ms": str(int(time.time() * 1000) + 60_000),
                "Lambda-Runtime-Invoked-Function-Arn":
                    "arn:aws:lambda:us-east-1:000000000000:function:narad-api",
                "Lambda-Runtime-Trace-Id": "Root=1-00000000-000000000000000000000000",
            },
        )

    def do_POST(self):
        body = self._body()
        if self.path == RUNTIME + "/init/error":
            sys.stderr.write(f"init error: {body[:2000]!r}\n")
            return self._reply(202)
        parts = self.path[len(RUNTIME + "/invocation/"):].split("/")
        if len(parts) != 2 or parts[1] not in ("response", "error"):
            return self._reply(404)
        with inflight_lock:
            inv = inflight.pop(parts[0], None)
        if inv is None:
            return self._reply(400)
        if parts[1] == "response":
            inv.response = json.loads(body)
        else:
            inv.error = body.decode(errors="replace")
        inv.done.set()
        self._reply(202)


class Front(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _handle(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        path, _, query = self.path.partition("?")
        now = time.time()
        headers = {}
        for k, v in self.headers.items():
            k = k.lower()
            headers[k] = headers[k] + "," + v if k in headers else v
        event = {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path,
            "rawQueryString": query,
            "headers": headers,
            "requestContext": {
                "accountId": "000000000000",
                "apiId": "local",
                "domainName": "localhost",
                "domainPrefix": "localhost",
                "http": {
                    "method": self.command,
                    "path": path,
                    "protocol": "HTTP/1.1",
                    "sourceIp": self.client_address[0],
                    "userAgent": headers.get("user-agent", ""),
                },
                "requestId": str(uuid.uuid4()),
                "routeKey": "$default",
                "stage": "$default",
                "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
                "timeEpoch": int(now * 1000),
            },
            "body": base64.b64encode(body).decode(),
            "isBase64Encoded": True,
        }
        inv = Invocation(event)
        pending.put(inv)
        if not inv.done.wait(65) or inv.response is None:
            detail = inv.error or "the function did not answer"
            return self._send(502, {"content-type": "text/plain"}, detail.encode())
        r = inv.response
        out = r.get("body") or ""
        out = base64.b64decode(out) if r.get("isBase64Encoded") else out.encode()
        self._send(int(r.get("statusCode", 200)), r.get("headers") or {}, out,
                   r.get("cookies") or [])

    def _send(self, status, headers, body, cookies=()):
        self.send_response(status)
        for k, v in headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        for c in cookies:
            self.send_header("set-cookie", c)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


def serve(port, handler):
    http.server.ThreadingHTTPServer.request_queue_size = 1024
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the function's bootstrap binary")
    ap.add_argument("--port", type=int, default=9400, help="HTTP front port")
    ap.add_argument("--concurrency", type=int, default=32,
                    help="AWS_LAMBDA_MAX_CONCURRENCY of the one environment")
    ap.add_argument("--env-file", help="KEY=VALUE lines for the function")
    args = ap.parse_args()

    runtime = serve(0, Runtime)
    serve(args.port, Front)
    env = dict(os.environ)
    if args.env_file:
        with open(args.env_file) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    env[k] = v
    env.update({
        "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{runtime.server_address[1]}",
        "AWS_LAMBDA_MAX_CONCURRENCY": str(args.concurrency),
        "AWS_LAMBDA_FUNCTION_NAME": "narad-api",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "2048",
        "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/narad-api",
        "AWS_LAMBDA_LOG_STREAM_NAME": "local",
    })
    proc = subprocess.Popen([args.bin], env=env)

    def stop(*_):
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"one environment, {args.concurrency} concurrent invocations, "
          f"at http://127.0.0.1:{args.port}", flush=True)
    code = proc.wait()
    sys.stderr.write(f"the function exited with {code}\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
