"""api/http_guard.py against a real `evidentia serve` (raw sockets): slow headers
and slow bodies are dropped, connections are capped, and an upload without a
key is answered 401 before its body is read."""

from __future__ import annotations

import os
import socket
import time

import httpx
import pytest

from tests.utils.server import Server

pytestmark = pytest.mark.slow

ADMIN = "admin-secret-for-guard-tests"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("guard")
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENTIA_")}
    server_env.update(EVIDENTIA_DATA_DIR=str(tmp_path / "data"), EVIDENTIA_BACKEND="embedded",
                      EVIDENTIA_ADMIN_KEY=ADMIN, EVIDENTIA_DENSE="off", EVIDENTIA_HTTP_HEADER_TIMEOUT_S="1",
                      EVIDENTIA_HTTP_BODY_TIMEOUT_S="2", EVIDENTIA_HTTP_MAX_CONNECTIONS="8")
    s = Server(server_env, tmp_path / "server.log")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Send ``trickle`` a byte every 0.2 s until the server closes; (elapsed, what it answered)."""
    t0 = time.monotonic()
    answer = b""
    sock.settimeout(0.2)
    i = 0
    while time.monotonic() - t0 < seconds:
        if trickle:
            try:
                sock.sendall(trickle[i % len(trickle): i % len(trickle) + 1])
            except OSError:
                break
            i += 1
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not chunk:
            break
        answer += chunk
    return time.monotonic() - t0, answer


def test_slow_headers_are_dropped(server):
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    elapsed, answer = closed_within(sock, 8, trickle=b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n")
    assert elapsed < 3, "a connection trickling its headers was kept open"
    assert answer.startswith(b"HTTP/1.1 408") and b"EVIDENTIA_HTTP_HEADER_TIMEOUT_S" in answer


def test_a_silent_connection_is_dropped(server):
    elapsed, _ = closed_within(connect(server), 8)
    assert elapsed < 3


def test_slow_bodies_are_dropped(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 5000\r\n\r\n{")
    elapsed, answer = closed_within(sock, 10, trickle=b" ")
    assert elapsed < 4, "a connection trickling its body was kept open"
    # and the server still answers others
    assert httpx.get(server.url + "/health", timeout=2).status_code == 200


def test_upload_without_a_key_is_refused_before_the_body(server):
    sock = connect(server)
    t0 = time.monotonic()
    sock.sendall(b"POST /v1/documents HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: 52428800\r\n\r\n"
                 + b"--xyz\r\n" + b"A" * 65536)  # 64 KB of a declared 50 MB
    sock.settimeout(5)
    answer = b""
    while b"missing API key" not in answer and time.monotonic() - t0 < 5:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    assert time.monotonic() - t0 < 2  # 64 KB of 50 MB sent: the body was not waited for
    assert answer.startswith(b"HTTP/1.1 401") and b"missing API key" in answer
    bad = httpx.post(server.url + "/v1/documents", headers={"X-API-Key": "evk_nope_nope"},
                     files={"file": ("a.pdf", b"%PDF-1.4 " + b"0" * 1000, "application/pdf")}, timeout=5)
    assert bad.status_code == 401 and "invalid API key" in bad.json()["error"]["message"]


def test_connections_over_the_cap_get_503(server):
    held = [connect(server) for _ in range(8)]
    try:
        time.sleep(0.2)
        r = httpx.get(server.url + "/health", timeout=2)
        assert r.status_code == 503
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(server.url + "/health", timeout=2).status_code == 200


def test_a_trailing_slash_redirect_names_no_host_the_client_sent(server):
    """Starlette's redirect wrote the Host header into Location: the sender chose where a
    client (or a shared cache) is sent. Now the Location is this server's path alone."""
    key = {"X-API-Key": "ev_not_a_key"}
    for host in ("evil.example", "EVIL.example:8443"):
        r = httpx.get(server.url + "/v1/documents/?limit=5", headers={"Host": host, **key}, follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "/v1/documents?limit=5", r.headers
    # a path that would read as another host (//evil.example) keeps to this one
    r = httpx.get(server.url + "//evil.example/", headers={"Host": "x.test"}, follow_redirects=False)
    assert r.status_code == 404 or not r.headers["location"].startswith("//"), r.headers
    # followed, it lands on this server, whatever Host was sent
    r = httpx.get(server.url + "/v1/documents/", headers=key, follow_redirects=True)
    assert r.status_code == 401 and r.url.path == "/v1/documents"
