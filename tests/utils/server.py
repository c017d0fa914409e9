"""A real `evidentia serve` process on a free loopback port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def evidentia_exe() -> str:
    local = Path(sys.executable).with_name("evidentia")
    found = str(local) if local.exists() else shutil.which("evidentia")
    if not found:
        pytest.skip("the evidentia console script is not installed")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, env: dict[str, str], log: Path, exe: str | None = None) -> None:
        """``exe``: another checkout's `evidentia` (the benchmarks compare versions)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([exe or evidentia_exe(), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--log-level", "warning"], env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("server not ready in time")

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
