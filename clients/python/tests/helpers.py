"""Running worker scripts as subprocesses, with their output readable line by line."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence

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
