#!/usr/bin/env python3
"""Tries to reproduce LocalStack keeping a PUT torn by a client that died mid-request.

Writes an object, then starts a conditional PUT (If-Match) of a new body in the AWS SDK's
aws-chunked encoding with a CRC-32 trailer, sends half of it, and resets the connection
(what a SIGKILLed process does). Then reads the object back twice and says whether it is
the old body, the new one, or neither (torn). Standard library only; LocalStack on
127.0.0.1:4566 with the bucket narad-test (localstack/start.sh).

    python3 localstack/torn-write.py [tries]
"""
import sys
import socket, struct, time, urllib.request, base64, zlib
HOST, PORT = "127.0.0.1", 4566


def attempt(cut):
    path = f"/narad-test/repro-torn/obj-{time.time_ns()}"
    old = b"A" * 200_000
    r = urllib.request.urlopen(urllib.request.Request(f"http://{HOST}:{PORT}{path}", data=old, method="PUT"))
    etag = r.headers["ETag"]; print("PUT old:", r.status, etag)
    new = b"B" * 200_000
    crc = base64.b64encode(zlib.crc32(new).to_bytes(4, "big")).decode()
    body = f"{len(new):x}\r\n".encode() + new + b"\r\n0\r\n" + f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    s = socket.create_connection((HOST, PORT))
    s.sendall((f"PUT {path} HTTP/1.1\r\nHost: {HOST}:{PORT}\r\nContent-Length: {len(body)}\r\n"
               f"If-Match: {etag}\r\nContent-Encoding: aws-chunked\r\n"
               f"x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER\r\n"
               f"x-amz-decoded-content-length: {len(new)}\r\nx-amz-trailer: x-amz-checksum-crc32\r\n"
               f"x-amz-sdk-checksum-algorithm: CRC32\r\n\r\n").encode())
    s.sendall(body[: int(len(body) * cut)])
    time.sleep(0.3)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(1)
    bad = 0
    for i in range(2):
        try:
            r = urllib.request.urlopen(f"http://{HOST}:{PORT}{path}", timeout=10)
            got = r.read()
            print("GET:", r.status, "ETag", r.headers["ETag"], "crc32 header", r.headers.get("x-amz-checksum-crc32"), "len", len(got),
                  "is old" if got == old else "is new" if got == new else f"is NEITHER (torn: {got[:3]!r}...{got[-3:]!r})")
            bad += got not in (old, new)
        except Exception as e:
            print("GET failed:", e)
            bad += 1
    return min(bad, 1)


torn = 0
tries = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for i in range(tries):
    torn += attempt((i + 1) / (tries + 1))
print(f"torn objects: {torn}")
