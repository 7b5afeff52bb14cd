"""A worker whose handler takes SLEEP seconds and records "start p/o" and "done p/o" lines.

Usage: slow_worker.py TOPIC RECORD_FILE SLEEP (server from NARAD_URL, NARAD_USER, NARAD_PASS)."""

import os
import sys
import time

import narad

topic, record, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])


def note(line: str) -> None:
    with open(record, "a") as f:
        f.write(line + "\n")
        f.flush()


def handle(msg: narad.Message) -> None:
    note(f"start {msg.partition}/{msg.offset}")
    time.sleep(pause)
    note(f"done {msg.partition}/{msg.offset}")


client = narad.Client(os.environ["NARAD_URL"], os.environ["NARAD_USER"], os.environ["NARAD_PASS"])
narad.Worker(client, topic, handle, stop_timeout=float(os.environ.get("STOP_TIMEOUT", "30"))).run()
note("exited")
