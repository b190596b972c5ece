"""JupyterLab on loopback, in a fresh temporary home, serving a temporary copy of the notebooks.

Nothing of the user's Jupyter set-up is read (config, data, runtime, IPython and workspace
folders all live in the temporary home), and the committed notebooks are never opened: the
server's root is a copy. The settings written there make every cell part of the page (no
windowing, so a figure far down is in the DOM) and keep notification toasts and news fetches off.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nbformat

SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
}


@dataclass(frozen=True)
class Lab:
    """A running server: its base URL, token and the folder it serves."""

    url: str
    token: str
    root: Path
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _wait_ready(url: str, token: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode} before it was ready:\n{_tail(log)}")
        try:
            _api(url, token, "/api/status")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"JupyterLab was not ready after {timeout_s:.0f} s:\n{_tail(log)}")


@contextmanager
def running_lab(notebooks: Path, extra: dict | None = None, ready_timeout_s: float = 180):
    """Start JupyterLab on 127.0.0.1 serving a copy of ``notebooks``; stop it on exit.

    ``extra`` maps file names to ``nbformat`` notebooks written beside the copies.
    """
    home = Path(tempfile.mkdtemp(prefix="c2graph-browser-"))
    try:
        root = home / "notebooks"
        shutil.copytree(notebooks, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for name, nb in (extra or {}).items():
            nbformat.write(nb, root / name)
        for name, values in SETTINGS.items():
            path = home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
                   JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
                   MPLCONFIGDIR=str(home / "matplotlib"))
        port, token = free_port(), secrets.token_hex(16)
        args = [sys.executable, "-m", "jupyterlab",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
                f"--ServerApp.root_dir={root}",
                f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.geteuid() == 0:
            args.append("--allow-root")
        log = home / "jupyterlab.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                    start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, token, proc, log, ready_timeout_s)
            yield Lab(url, token, root, log)
        finally:
            _shutdown_kernels(url, token)
            _stop(proc)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _api(url: str, token: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{url}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = reply.read()
    return json.loads(body) if body else None


def _shutdown_kernels(url: str, token: str) -> None:
    """Shut down every kernel the server still runs (each runs in a session of its own)."""
    try:
        for kernel in _api(url, token, "/api/kernels"):
            _api(url, token, f"/api/kernels/{kernel['id']}", method="DELETE")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass  # the server is gone already; stopping it below is all that is left


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server and its kernels (its own process group, which it started)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
