"""The hub under load (`make hub-test`, as root): start the hub of hub/jupyterhub_config.py on a free
port with N students of its own (Unix accounts hubtest01... , made here and removed at the end),
then, for every student at once, through the hub's REST API: sign in (the first login sets the
password), take a token, start their server, and run one notebook's code cells in a kernel of
their own server. Every notebook must finish with no error, every student must find their own
student copies, and no student may read another's files (through the other's server, or from
their own kernel through the file system). Prints what it measured and writes it as JSON.

    python hub/load_test.py --students 8 --notebook notebooks/01_the_ratio2_compressor.ipynb --out out/hub-test.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import room  # noqa: E402

PREFIX = "hubtest"
PASSWORD = "load-test-" + uuid.uuid4().hex[:12]
CELL_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_text(port: int, state: Path, students: int, memory_gb: float, cpus: float) -> str:
    return f'''[hub]
ip = "127.0.0.1"
port = {port}
state = "{state}"
[students]
prefix = "{PREFIX}"
count = {students}
names = []
admins = []
min_password_length = 8
[limits]
memory_gb = {memory_gb}
cpus = {cpus}
[gpus]
devices = []
'''


class Student:
    """One simulated student: a browser's session with the hub, then a token for its REST API."""

    def __init__(self, hub: str, name: str):
        self.hub, self.name, self.session = hub, name, requests.Session()
        self.token = ""

    def sign_in(self) -> None:
        page = self.session.get(f"{self.hub}/hub/login", timeout=60)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
        done = self.session.post(f"{self.hub}/hub/login", timeout=120, allow_redirects=False,
                                 data={"username": self.name, "password": PASSWORD, "_xsrf": xsrf})
        if done.status_code != 302 or "login" in done.headers.get("Location", "/hub/login"):
            raise RuntimeError(f"{self.name}: sign-in refused (HTTP {done.status_code})")
        made = self.session.post(f"{self.hub}/hub/api/users/{self.name}/tokens", timeout=60,
                                 headers={"X-XSRFToken": self.session.cookies.get("_xsrf", xsrf)},
                                 json={"note": "hub load test", "expires_in": 3600})
        made.raise_for_status()
        self.token = made.json()["token"]

    def api(self, method: str, path: str, timeout: float = 120, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, f"{self.hub}{path}", headers=headers, timeout=timeout, **kwargs)

    def start_server(self) -> None:
        started = self.api("POST", f"/hub/api/users/{self.name}/server")
        if started.status_code not in (201, 202):
            raise RuntimeError(f"{self.name}: server not started (HTTP {started.status_code}: {started.text[:200]})")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            server = self.api("GET", f"/hub/api/users/{self.name}").json().get("servers", {}).get("", {})
            if server.get("ready"):
                return
            time.sleep(1)
        raise RuntimeError(f"{self.name}: server not ready after 300 s")


async def run_cells(student: Student, cells: list[str]) -> list[str]:
    """Run ``cells`` one by one in a new kernel of the student's server (cwd ~/c2graph); return the
    errors (empty when every cell ran)."""
    base = f"/user/{student.name}/api/kernels"
    kernel = student.api("POST", base, json={"name": "python3", "path": "c2graph"})
    kernel.raise_for_status()
    kernel_id = kernel.json()["id"]
    url = f"{student.hub.replace('http', 'ws', 1)}{base}/{kernel_id}/channels"
    socket_ = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {student.token}"}),
                                      max_message_size=256 * 2**20)
    errors, session = [], uuid.uuid4().hex
    try:
        for index, code in enumerate(cells):
            msg_id = uuid.uuid4().hex
            header = {"msg_id": msg_id, "msg_type": "execute_request", "username": student.name,
                      "session": session, "date": "", "version": "5.3"}
            await socket_.write_message(json.dumps({
                "header": header, "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            while True:
                raw = await asyncio.wait_for(socket_.read_message(), CELL_TIMEOUT_S)
                if raw is None:
                    raise RuntimeError(f"{student.name}: the kernel's connection closed at cell {index}")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "execute_reply":
                    if msg["content"]["status"] != "ok":
                        errors.append(f"cell {index}: {msg['content'].get('ename')}: {msg['content'].get('evalue')}")
                    break
            if errors:
                break
    finally:
        socket_.close()
        student.api("DELETE", f"{base}/{kernel_id}")
    return errors


def isolation_code(own: str, other: str, notebook: str) -> str:
    """A cell for ``own``'s kernel: its copy is there, and ``other``'s home and copy cannot be read."""
    other_home = pwd.getpwnam(other).pw_dir
    return f'''import os
assert os.path.isfile({notebook!r}), "no student copy of {notebook} in ~/c2graph"
for path in ({other_home!r}, {os.path.join(other_home, "c2graph", notebook)!r}):
    try:
        (os.listdir if os.path.isdir(path) else open)(path)
    except PermissionError:
        continue
    raise AssertionError("{own} could read " + path)
'''


def peak_memory_gb(name: str) -> float | None:
    """The most memory student ``name``'s cgroup held (v1 max_usage_in_bytes, v2 memory.peak)."""
    for folder in room.limit_folders(name):
        for file in ("memory.peak", "memory.max_usage_in_bytes"):
            if (folder / file).exists():
                return int((folder / file).read_text().split()[0]) / 2**30
    return None


def one_student(student: "Student", other: str, cells: list[str], notebook: str) -> dict:
    name = student.name
    started = time.monotonic()
    student.sign_in()
    signed_in = time.monotonic()
    student.start_server()
    ready = time.monotonic()
    forbidden = student.api("GET", f"/user/{other}/api/contents/c2graph")
    problems = [] if forbidden.status_code in (403, 404, 302) else [
        f"{name} read {other}'s folder through {other}'s server (HTTP {forbidden.status_code})"]
    errors = asyncio.run(run_cells(student, [isolation_code(name, other, notebook), *cells]))
    done = time.monotonic()
    return {"name": name, "sign_in_s": round(signed_in - started, 1), "server_start_s": round(ready - signed_in, 1),
            "notebook_s": round(done - ready, 1), "errors": errors + problems, "peak_memory_gb": peak_memory_gb(name)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--notebook", type=Path, default=room.REPOSITORY / "notebooks" / "01_the_ratio2_compressor.ipynb")
    parser.add_argument("--memory-gb", type=float, default=room.load().memory_gb)
    parser.add_argument("--cpus", type=float, default=room.load().cpus)
    parser.add_argument("--out", type=Path, default=Path("out/hub-test.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("c2graph hub-test: run it as root: it makes and removes Unix accounts hubtest01...", file=sys.stderr)
        return 1
    venv = Path(os.environ.get("C2GRAPH_VENV", room.REPOSITORY / "build" / "hub-venv"))
    cells = [c.source for c in nbformat.read(args.notebook, as_version=4).cells if c.cell_type == "code"]
    state = Path(tempfile.mkdtemp(prefix="c2graph-hub-test-"))
    settings = state / "settings.toml"
    port = free_port()
    settings.write_text(settings_text(port, state / "hub", args.students, args.memory_gb, args.cpus))
    names = [f"{PREFIX}{k:02d}" for k in range(1, args.students + 1)]
    log = open(state / "hub.log", "w")
    env = {**os.environ, "C2GRAPH_HUB_SETTINGS": str(settings), "C2GRAPH_VENV": str(venv)}
    hub_proc = subprocess.Popen([str(venv / "bin" / "jupyterhub"), "-f", str(HERE / "jupyterhub_config.py")],
                                cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    hub = f"http://127.0.0.1:{port}"
    results, failures = [], []
    students = [Student(hub, name) for name in names]
    load_before = os.getloadavg()
    try:
        deadline = time.monotonic() + 120
        while True:
            if hub_proc.poll() is not None:
                raise RuntimeError(f"the hub stopped (exit {hub_proc.returncode}): {(state / 'hub.log').read_text()[-2000:]}")
            try:
                if requests.get(f"{hub}/hub/api/", timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the hub did not answer within 120 s")
            time.sleep(1)
        started = time.monotonic()
        with ThreadPoolExecutor(len(names)) as pool:
            futures = [pool.submit(one_student, student, names[(i + 1) % len(names)], cells, args.notebook.name)
                       for i, student in enumerate(students)]
            for name, future in zip(names, futures):
                try:
                    results.append(future.result())
                except Exception as e:  # one student's failure is reported with the others
                    failures.append(f"{name}: {type(e).__name__}: {e}")
        wall = time.monotonic() - started
    finally:
        for student in students:  # each stops their own server, through the hub
            try:
                student.api("DELETE", f"/hub/api/users/{student.name}/server", timeout=60)
            except requests.RequestException:
                pass
        os.killpg(hub_proc.pid, 15)
        try:
            hub_proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(hub_proc.pid, 9)
        log.close()
        for name in names:  # whatever the test's accounts still run, then the accounts and their cgroups
            left = subprocess.run(["pgrep", "-u", name], capture_output=True, text=True).stdout.split()
            for pid in map(int, left):
                os.kill(pid, 9)
        time.sleep(1)
        for name in names:
            subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
            for folder in room.limit_folders(name):
                if folder.exists():
                    folder.rmdir()
        for folder in {f.parent for f in room.limit_folders(names[0])}:  # the group, when no student is left
            if folder.exists() and not any(p.is_dir() for p in folder.iterdir()):
                folder.rmdir()
    failures += [f"{r['name']}: {e}" for r in results for e in r["errors"]]
    times = sorted(r["notebook_s"] for r in results)
    summary = {
        "students": args.students, "notebook": args.notebook.name, "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before], "memory_gb_limit": args.memory_gb,
        "cpus_limit": args.cpus, "wall_s": round(wall, 1) if results else None,
        "notebook_s": {"min": times[0], "median": statistics.median(times), "max": times[-1]} if times else None,
        "failures": failures, "per_student": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    for r in results:
        print(f"{r['name']}: signed in {r['sign_in_s']} s, server ready {r['server_start_s']} s, notebook "
              f"{r['notebook_s']} s, peak memory {r['peak_memory_gb'] and round(r['peak_memory_gb'], 2)} GB")
    print(f"{len(results)} of {args.students} students ran {args.notebook.name} at once on {os.cpu_count()} cores "
          f"(load before {load_before[0]:.1f}) in {summary['wall_s']} s; results in {args.out}")
    if failures:
        print(f"hub log kept in {state / 'hub.log'}")
    else:
        shutil.rmtree(state, ignore_errors=True)
    for line in failures:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failures or len(results) != args.students else 0


if __name__ == "__main__":
    sys.exit(main())
