"""Real servers for the tests: redis-server on a free loopback port, apps under uvicorn and
werkzeug on free ports. Nothing is mocked."""

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watchdog(pid: int) -> subprocess.Popen:
    """A `sh` loop that kills `pid` once this test process is gone. A fixture's teardown never
    runs when the test run itself is killed; the watchdog does, so no server outlives its tests.
    It ends by itself within a second of `pid` ending."""
    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; "
        f"kill -9 {pid} 2>/dev/null"
    )
    return subprocess.Popen(
        ["sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class RedisServer:
    """A redis-server of its own on 127.0.0.1 (never the default port), without persistence."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.watchdog = watchdog(self.proc.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail("redis-server did not start within 10 s")

    def pause(self) -> None:
        """Freezes the server (SIGSTOP): connections stay open and nothing answers."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.watchdog.kill()
        self.watchdog.wait()


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture()
def stopped_redis():
    """The URL of a Redis that was running and is now stopped."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture()
def ident() -> str:
    """A fresh identity, so tests sharing the session's Redis never share state."""
    return f"user:{uuid.uuid4().hex[:12]}"


def serve_uvicorn(app):
    """Runs `app` under uvicorn on a free loopback port in a thread; returns (base_url, stop)."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            proxy_headers=False)  # the middleware resolves trusted proxies itself
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.02)

    def stop():
        server.should_exit = True
        thread.join(timeout=10)

    return f"http://127.0.0.1:{port}", stop


def serve_wsgi(app):
    """Runs a WSGI app under werkzeug's threaded server on a free loopback port."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        thread.join(timeout=10)

    return f"http://127.0.0.1:{server.server_port}", stop


def sluice_bin() -> str:
    path = os.environ.get("SLUICE_BIN")
    if path and os.path.exists(path):
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    for profile in ("debug", "release"):
        candidate = os.path.join(here, "..", "..", "..", "target", profile, "sluice")
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    pytest.fail("the sluice CLI is not built: run `cargo build -p sluice-cli` or set SLUICE_BIN")
