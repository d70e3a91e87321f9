"""A real gossamer node for the tests: started on a free port with a temporary config, its
address read from its log, and killed on stop (or when the test process exits).

The binary is $GOSSAMER_BIN (tests/python_client.rs sets it to Cargo's build of it), else
target/debug/gossamer or target/release/gossamer under the repository root.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Optional

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

#: The longest a node may take to start and say where it listens.
START_TIMEOUT = 20.0


def binary() -> str:
    configured = os.environ.get("GOSSAMER_BIN")
    if configured:
        return configured
    for profile in ("debug", "release"):
        path = os.path.join(REPO, "target", profile, "gossamer")
        if os.access(path, os.X_OK):
            return path
    raise RuntimeError(
        "no gossamer binary: set GOSSAMER_BIN or run `cargo build --bin gossamer` first"
    )


class Node:
    """``with Node(rules) as node:`` runs ``gossamer serve`` with `rules` (TOML) on
    127.0.0.1, on `port` or one the kernel picks; ``node.url`` is its address."""

    def __init__(self, rules: str, port: int = 0):
        self.rules = rules
        self.port = port
        self.url = ""
        self._dir: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None
        self._log: "queue.Queue[str]" = queue.Queue()
        self.log_lines: list[str] = []

    def __enter__(self) -> "Node":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="gossamer-pytest-")
        config = os.path.join(self._dir, "rules.toml")
        with open(config, "w") as f:
            f.write(self.rules)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOSSAMER_")}
        env.pop("RUST_LOG", None)
        self._process = subprocess.Popen(
            [binary(), "serve", "--config", config, "--http", f"127.0.0.1:{self.port}", "--log-format", "json"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.url:
            left = deadline - time.monotonic()
            if left <= 0 or self._process.poll() is not None:
                self.stop()
                raise RuntimeError(f"gossamer did not start: {self.log_lines[-20:]}")
            try:
                line = self._log.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            fields = event.get("fields", {})
            if fields.get("message") == "serving" and "http" in fields:
                self.url = f"http://{fields['http']}"

    def _read_log(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        for line in self._process.stderr:
            self.log_lines.append(line.rstrip())
            self._log.put(line)

    def stop(self) -> None:
        """Kills the node (SIGKILL: the tests want it gone, not drained) and waits for it."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait(timeout=10)
            # The log ends with the process; the reader is done once it has read the rest.
            self._reader.join(timeout=5)
            if self._process.stderr is not None:
                self._process.stderr.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Silent:
    """A TCP listener that accepts connections and never answers: a node that hangs."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self._sock.getsockname()[1]

    def __enter__(self) -> "Silent":
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
