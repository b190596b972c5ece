"""The hub under load (`make hub-test`, as root): start the hub of hub/jupyterhub_config.py on a free
port with N students and an instructor of its own (Unix accounts hubtest01... and hubtestadmin, with
passwords made here as `make hub` makes them), then:

- before anyone has signed in, every student tries to take another student's account and the
  instructor's with their own password, and a name not on the list and a short password are tried:
  each must be refused, with words that say why;
- for every student at once, through the hub's REST API: sign in with their password, take a token,
  start their server, and run one notebook's code cells in a kernel of their own server. Every
  notebook must finish with no error, every student must find their own student copies, and no
  student may read another's files (through the other's server, or from their own kernel through
  the file system).

Whatever fails (Ctrl-C and SIGTERM included), the accounts, their processes and cgroups, the hub's
state and /tmp/torchinductor_hubtest* are removed at the end. Prints what it measured and writes it as
JSON (and the hub's log beside it when something failed).

    python hub/load_test.py --students 8 --notebook notebooks/01_the_ratio2_compressor.ipynb --out out/hub-test.json
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
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
ADMIN = PREFIX + "admin"
CELL_TIMEOUT_S = 300
SERVER_TIMEOUT_S = 600
"""As the hub's own Spawner.start_timeout."""


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
admins = ["{ADMIN}"]
min_password_length = 8
[limits]
memory_gb = {memory_gb}
cpus = {cpus}
[gpus]
devices = []
'''


class Student:
    """One simulated student: a browser's session with the hub, then a token for its REST API."""

    def __init__(self, hub: str, name: str, password: str):
        self.hub, self.name, self.password, self.session = hub, name, password, requests.Session()
        self.token = self.xsrf = ""

    def try_sign_in(self, name: str, password: str) -> tuple[bool, str]:
        """Sign in as ``name`` with ``password`` through the login form: (signed in, the page's words)."""
        page = self.session.get(f"{self.hub}/hub/login", timeout=60)
        xsrf = self.xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
        done = self.session.post(f"{self.hub}/hub/login", timeout=120, allow_redirects=False,
                                 data={"username": name, "password": password, "_xsrf": xsrf})
        signed_in = done.status_code == 302 and "login" not in done.headers.get("Location", "/hub/login")
        return signed_in, html.unescape(done.text)

    def sign_in(self) -> None:
        signed_in, page = self.try_sign_in(self.name, self.password)
        if not signed_in:
            raise RuntimeError(f"{self.name}: sign-in refused with their own password")
        xsrf = self.session.cookies.get("_xsrf", self.xsrf)
        made = self.session.post(f"{self.hub}/hub/api/users/{self.name}/tokens", timeout=60,
                                 headers={"X-XSRFToken": xsrf},
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
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while time.monotonic() < deadline:
            server = self.api("GET", f"/hub/api/users/{self.name}").json().get("servers", {}).get("", {})
            if server.get("ready"):
                return
            time.sleep(1)
        raise RuntimeError(f"{self.name}: server not ready after {SERVER_TIMEOUT_S} s")


async def run_cells(student: Student, cells: list[str]) -> tuple[list[str], tuple[int, float]]:
    """Run ``cells`` one by one in a new kernel of the student's server (cwd ~/c2graph); return the
    errors (empty when every cell ran) and the slowest cell (its index among ``cells``, seconds)."""
    base = f"/user/{student.name}/api/kernels"
    kernel = student.api("POST", base, json={"name": "python3", "path": "c2graph"})
    kernel.raise_for_status()
    kernel_id = kernel.json()["id"]
    url = f"{student.hub.replace('http', 'ws', 1)}{base}/{kernel_id}/channels"
    # a loaded machine answers slowly: tornado's 20 s default gave up on 4 of 20 students' kernels
    socket_ = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {student.token}"},
                                                  connect_timeout=CELL_TIMEOUT_S, request_timeout=CELL_TIMEOUT_S),
                                      max_message_size=256 * 2**20)
    errors, session, slowest = [], uuid.uuid4().hex, (0, 0.0)
    try:
        for index, code in enumerate(cells):
            began = time.monotonic()
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
                    slowest = max(slowest, (index, round(time.monotonic() - began, 1)), key=lambda s: s[1])
                    if msg["content"]["status"] != "ok":
                        errors.append(f"cell {index}: {msg['content'].get('ename')}: {msg['content'].get('evalue')}")
                    break
            if errors:
                break
    finally:
        socket_.close()
        student.api("DELETE", f"{base}/{kernel_id}")
    return errors, slowest


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
    errors, (cell, seconds) = asyncio.run(run_cells(student, [isolation_code(name, other, notebook), *cells]))
    done = time.monotonic()
    return {"name": name, "sign_in_s": round(signed_in - started, 1), "server_start_s": round(ready - signed_in, 1),
            "notebook_s": round(done - ready, 1), "slowest_cell": {"code_cell": cell - 1, "s": seconds},
            "errors": errors + problems, "peak_memory_gb": peak_memory_gb(name)}


def takeover_attempts(hub: str, names: list[str], passwords: dict[str, str], min_length: int) -> list[str]:
    """Before anyone has signed in: each student tries the next student's account and the instructor's
    with their own password; then a name not on the list and a short password. Returns what got in,
    or was refused without saying why."""
    problems = []
    tries = [(name, other, passwords[name], "is not the password of")
             for name, other in zip(names, names[1:] + names[:1]) for other in (other, ADMIN) if other != name]
    tries += [(names[0], "nobody", passwords[names[0]], "is not an account of this room"),
              (names[0], names[0], "x" * (min_length - 1), f"that password is {min_length - 1} characters")]
    for who, target, password, words in tries:
        signed_in, page = Student(hub, who, password).try_sign_in(target, password)
        if signed_in:
            problems.append(f"{who} signed in as {target} without {target}'s password")
        elif words not in page or "ask the instructor" not in page:
            problems.append(f"{who}'s sign-in as {target} was refused without the words {words!r} ... 'ask the instructor'")
    return problems


def clean_up(names: list[str], hub_proc: subprocess.Popen | None, state: Path) -> None:
    """Stop the hub and whatever the test's accounts still run; remove the accounts with their homes,
    their cgroups, Inductor's folders in /tmp and the hub's state. Each step runs whatever the one
    before it did."""
    if hub_proc is not None:
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(hub_proc.pid, sig)
                hub_proc.wait(wait)
                break
            except ProcessLookupError:  # the hub's group has ended already
                break
            except subprocess.TimeoutExpired:
                continue
    for name in names:
        room.remove_account(name)
        for folder in Path(tempfile.gettempdir()).glob(f"torchinductor_{name}"):
            shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)


class MemorySampler(threading.Thread):
    """The least memory this machine had available (/proc/meminfo's MemAvailable) while the test ran,
    read every 2 s: what the room left to everything else."""

    def __init__(self):
        super().__init__(daemon=True)
        self.least_gb, self.done = None, threading.Event()

    def run(self):
        while not self.done.wait(2):
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    gb = int(line.split()[1]) / 2**20
                    self.least_gb = gb if self.least_gb is None else min(self.least_gb, gb)


def stop_on_sigterm(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")


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
    names = [f"{PREFIX}{k:02d}" for k in range(1, args.students + 1)]
    state = Path(tempfile.mkdtemp(prefix="c2graph-hub-test-"))
    clean_up(names + [ADMIN], None, Path(tempfile.mkdtemp()))  # what a run killed with -9 left behind
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    hub_proc, results, failures, wall = None, [], [], None
    load_before = os.getloadavg()
    memory = MemorySampler()
    memory.start()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_copy = args.out.with_suffix(".log")
    try:
        settings = state / "settings.toml"
        port = free_port()
        settings.write_text(settings_text(port, state / "hub", args.students, args.memory_gb, args.cpus))
        min_length = room.load(settings).min_password_length
        passwords = room.Credentials(state / "hub" / room.PASSWORDS, min_length).hand_out(names + [ADMIN])
        env = {**os.environ, "C2GRAPH_HUB_SETTINGS": str(settings), "C2GRAPH_VENV": str(venv)}
        with open(state / "hub.log", "w") as log:
            hub_proc = subprocess.Popen([str(venv / "bin" / "jupyterhub"), "-f", str(HERE / "jupyterhub_config.py")],
                                        cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        hub = f"http://127.0.0.1:{port}"
        students = [Student(hub, name, passwords[name]) for name in names]
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
            failures += takeover_attempts(hub, names, passwords, min_length)
            started = time.monotonic()
            pool = ThreadPoolExecutor(len(names))
            try:
                futures = [pool.submit(one_student, student, names[(i + 1) % len(names)], cells, args.notebook.name)
                           for i, student in enumerate(students)]
                for name, future in zip(names, futures):
                    try:
                        results.append(future.result())
                    except Exception as e:  # one student's failure is reported with the others
                        failures.append(f"{name}: {type(e).__name__}: {e}")
                wall = time.monotonic() - started
            finally:  # on Ctrl-C or SIGTERM, clean up now: the students' threads end when the hub stops
                pool.shutdown(wait=False, cancel_futures=True)
        finally:
            for student in students:  # each stops their own server, through the hub
                try:
                    student.api("DELETE", f"/hub/api/users/{student.name}/server", timeout=60)
                except requests.RequestException:
                    pass
    except BaseException as e:  # Ctrl-C, SIGTERM or a failure before the students ran: reported, then cleaned up
        failures.append(f"the test stopped: {type(e).__name__}: {e}")
    finally:
        if failures and (state / "hub.log").exists():
            shutil.copy(state / "hub.log", log_copy)
        clean_up(names + [ADMIN], hub_proc, state)
        memory.done.set()
    failures += [f"{r['name']}: {e}" for r in results for e in r["errors"]]
    times = sorted(r["notebook_s"] for r in results)
    peaks = sorted(r["peak_memory_gb"] for r in results if r["peak_memory_gb"] is not None)
    summary = {
        "students": args.students, "notebook": args.notebook.name, "cores": os.cpu_count(),
        "memory_gb_machine": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_average_before": [round(x, 2) for x in load_before], "memory_gb_limit": args.memory_gb,
        "machine_memory_available_least_gb": memory.least_gb and round(memory.least_gb, 1),
        "cpus_limit": args.cpus, "wall_s": round(wall, 1) if wall is not None else None,
        "finished": len(results), "passed": sum(not r["errors"] for r in results), "notebook_s": {"min": times[0], "median": statistics.median(times), "max": times[-1]} if times else None,
        "peak_memory_gb": {"min": round(peaks[0], 2), "max": round(peaks[-1], 2)} if peaks else None,
        "failures": failures, "per_student": results,
    }
    args.out.write_text(json.dumps(summary, indent=1))
    for r in results:
        print(f"{r['name']}: signed in {r['sign_in_s']} s, server ready {r['server_start_s']} s, notebook "
              f"{r['notebook_s']} s, peak memory {r['peak_memory_gb'] and round(r['peak_memory_gb'], 2)} GB")
    print(f"{len(results)} of {args.students} students ran {args.notebook.name} at once on {os.cpu_count()} cores "
          f"(load before {load_before[0]:.1f}) in {summary['wall_s']} s; results in {args.out}; accounts, state and "
          "temporary folders removed")
    if failures and log_copy.exists():
        print(f"the hub's log: {log_copy}")
    for line in failures:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failures or len(results) != args.students else 0


if __name__ == "__main__":
    sys.exit(main())
