"""The platform wheel is the product: installed into a fresh virtual
environment with no Go on PATH, `kvtier serve` runs the daemon it carries
on the embedded default configuration, and `python -m kvtier stats` talks
to it.

KVTIER_WHEEL names the x86_64 wheel (./scripts/test.sh builds it with
scripts/build-wheel.sh); without it the test builds one.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from conftest import ROOT


def the_wheel(tmp: pathlib.Path) -> pathlib.Path:
    if w := os.environ.get("KVTIER_WHEEL"):
        return pathlib.Path(w)
    subprocess.run([str(ROOT / "scripts/build-wheel.sh"), str(tmp / "dist")], check=True)
    return next((tmp / "dist").glob("kvtier-*x86_64*.whl"))


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_wheel_in_a_fresh_venv_without_go() -> None:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kvw"))
    wheel = the_wheel(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], check=True)
    path = os.pathsep.join([str(venv / "bin")] + [
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (pathlib.Path(d) / "go").exists()])
    assert shutil.which("go", path=path) is None
    env = {**os.environ, "PATH": path}
    env.pop("GOROOT", None)
    out = subprocess.run(["kvtier", "version"], env=env, capture_output=True, text=True, check=True).stdout
    assert "kvtier" in out

    run = tmp / "run"
    run.mkdir()
    # The embedded default listens on 127.0.0.1:7070 (API) and :9464 (metrics).
    assert free(7070) and free(9464), "the embedded default's ports 7070 and 9464 are taken on this machine"
    proc = subprocess.Popen(["kvtier", "serve"], cwd=run, env=env, stderr=subprocess.PIPE, text=True)
    ready = threading.Event()
    log: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            if "kvtier API listening" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(60), "kvtier serve from the wheel did not start:\n" + "".join(log)
        st = subprocess.run([str(venv / "bin/python"), "-m", "kvtier", "stats", "--target", "unix:" + str(run / "kvtier.sock")],
                            cwd=run, env=env, capture_output=True, text=True, timeout=60)
        assert st.returncode == 0, st.stderr
        assert "local-disk" in st.stdout, st.stdout  # the embedded default's fs tier
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, "".join(log)


def test_the_pure_package_says_it_has_no_daemon() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "python/kvtier/__main__.py"), "serve"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "has no daemon binary" in r.stderr


def test_the_suite_runs_the_installed_package() -> None:
    """Under ./scripts/test.sh the tests import kvtier from the wheel, not
    from python/ (pytest runs with -P: no current directory on sys.path)."""
    if not os.environ.get("KVTIER_WHEEL"):
        return  # a run by hand against the tree
    import kvtier
    import kvtier.__main__

    assert "site-packages" in kvtier.__file__, kvtier.__file__
    assert kvtier.__main__.binary() is not None
