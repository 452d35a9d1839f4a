"""The processes of the serving benchmark: `vllm serve`, `kvtier serve`
and LMCache's multiprocess server, each started on loopback, waited for
until it answers, and stopped (with its log kept for the report when it
fails)."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Callable, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process whose output goes to a log file; stop() ends it and
    its children (it leads its own process group)."""

    def __init__(self, name: str, argv: Sequence[str], log: pathlib.Path, env: dict[str, str] | None = None,
                 cwd: pathlib.Path | None = None) -> None:
        self.name = name
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=True)

    def cpu_seconds(self) -> float:
        """User and system CPU time of the process so far (Linux /proc)."""
        try:
            fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-n:])
        except OSError:
            return ""

    def wait_ready(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it was ready:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} was not ready after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.25)

    def stop(self, grace: float = 20) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self._log.close()


def http_ok(url: str) -> Callable[[], bool]:
    def ok() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False
    return ok


def path_exists(p: pathlib.Path) -> Callable[[], bool]:
    return p.exists


def log_contains(proc: Proc, marker: str) -> Callable[[], bool]:
    def found() -> bool:
        return marker in proc.tail(200)
    return found


def quiet_env(**extra: str) -> dict[str, str]:
    """The environment of every third-party process: telemetry off, no
    download attempts."""
    env = dict(os.environ)
    env.update({
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "LMCACHE_TRACK_USAGE": "false", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env
