"""Fixtures: a real `narad serve`, from NARAD_URL (with NARAD_USER and NARAD_PASS) or started
here from the binary NARAD_BIN on a fresh file store and a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, List

import pytest

import narad


@dataclass
class Server:
    url: str
    user: str
    password: str

    def env(self) -> dict:
        """The environment for a subprocess that talks to this server (examples/worker.py)."""
        return dict(os.environ, NARAD_URL=self.url, NARAD_USER=self.user, NARAD_PASS=self.password)

    def client(self, **kwargs: object) -> narad.Client:
        return narad.Client(self.url, self.user, self.password, **kwargs)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    url = os.environ.get("NARAD_URL")
    if url:
        yield Server(url.rstrip("/"), os.environ.get("NARAD_USER", ""), os.environ.get("NARAD_PASS", ""))
        return
    binary = os.environ.get("NARAD_BIN", "")
    if not binary:
        pytest.fail("set NARAD_URL (with NARAD_USER, NARAD_PASS) or NARAD_BIN")
    with tempfile.TemporaryDirectory() as work:
        port = _free_port()
        env = dict(
            os.environ,
            NARAD_STORE=f"file://{work}/data",
            NARAD_LISTEN=f"127.0.0.1:{port}",
            NARAD_AUTH="pytest:pytest-secret",
            NARAD_LOG="warn",
        )
        log = open(os.path.join(work, "serve.log"), "wb")
        proc = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                pytest.fail("narad serve did not start")
            yield Server(url, "pytest", "pytest-secret")
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()


@pytest.fixture
def client(server: Server) -> narad.Client:
    return server.client()


@pytest.fixture
def new_topic(client: narad.Client) -> Iterator[Callable[..., str]]:
    """Creates topics with unique names (and the given settings); deletes them afterwards."""
    made: List[str] = []

    def make(**settings: object) -> str:
        name = f"py-{uuid.uuid4().hex[:12]}"
        client.create_topic(name, **settings)
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            client.delete_topic(name)
        except narad.NaradError:
            pass
