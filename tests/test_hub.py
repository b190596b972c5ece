"""The workshop hub's own pieces (hub/room.py, hub/auth.py), without a running hub: the settings file
an instructor edits, the passwords the organiser hands out and the sign-in that checks them (through
JupyterHub's authenticator, as the hub runs it), the GPU each student is given, the folders a student
must be able to read, and the cgroups that hold each student's limits. `make hub-test` runs the
hub itself under load."""

import importlib.util
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import subprocess

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("room", ROOT / "hub" / "room.py")
room = importlib.util.module_from_spec(_spec)
sys.modules["room"] = room
_spec.loader.exec_module(room)


def test_the_repositorys_settings_give_a_room_of_thirty_and_their_limits():
    settings = room.load()
    assert settings.students == tuple(f"student{k:02d}" for k in range(1, 31))
    assert settings.admins == ("instructor",) and settings.port == 8000 and settings.ip == ""
    assert settings.memory_gb > 0 and settings.cpus > 0 and settings.gpus == ()
    assert settings.gpu_of("student07") == ""


def _settings(tmp_path, **changes) -> Path:
    text = room.SETTINGS.read_text()
    for key, value in changes.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key, value, expected", [
    ("port", "0", "[hub] port = 0, expected a port, 1 to 65535"),
    ("state", '"relative/state"', "[hub] state = 'relative/state', expected an absolute path"),
    ("prefix", '"Student"', "[students] prefix = 'Student', expected a lower-case name"),
    ("memory_gb", '"2G"', "[limits] memory_gb = '2G', expected gigabytes, 0 for no limit"),
    ("devices", '["0"]', "[gpus] devices = ['0'], expected a list of CUDA device numbers, [] for none"),
])
def test_a_bad_setting_is_named_with_its_file_and_key(tmp_path, key, value, expected):
    path = _settings(tmp_path, **{key: value})
    with pytest.raises(room.SettingsError) as raised:
        room.load(path)
    assert str(raised.value).startswith(f"{path}: {expected}")


def test_students_share_the_gpus_round_robin(tmp_path):
    settings = room.load(_settings(tmp_path, count="5", names='["alice"]', devices="[2, 3]"))
    assert settings.students == ("student01", "student02", "student03", "student04", "student05", "alice")
    assert [settings.gpu_of(n) for n in settings.students + ("instructor",)] == ["2", "3", "2", "3", "2", "3", "2"]


def test_passwords_are_made_by_the_organiser_stored_hashed_and_never_set_by_signing_in(tmp_path):
    path = tmp_path / "state" / "passwords.json"
    credentials = room.Credentials(path, min_length=8)
    assert not credentials.check("student01", "correct horse")  # no password yet: nothing gets in
    assert not path.exists()  # and signing in wrote none
    made = credentials.hand_out(["student01", "student02", "instructor"])
    assert set(made) == {"student01", "student02", "instructor"} and len(set(made.values())) == 3
    assert all(len(pw) >= 12 and set(pw) <= set(room.ALPHABET + "-") for pw in made.values())
    assert credentials.check("student01", made["student01"]) and not credentials.check("student01", made["student02"])
    assert credentials.hand_out(["student01", "student02", "student03"]) .keys() == {"student03"}  # the others kept
    assert credentials.check("student01", made["student01"])
    renewed = credentials.hand_out(["student01"], renew=True)["student01"]
    assert not credentials.check("student01", made["student01"]) and credentials.check("student01", renewed)
    credentials.set("instructor", "the instructor's own")
    assert credentials.check("instructor", "the instructor's own")
    with pytest.raises(ValueError, match="password: 5 characters, expected 8 or more"):
        credentials.set("instructor", "short")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = path.read_text()
    assert set(json.loads(stored)) == {"student01", "student02", "student03", "instructor"}
    assert not any(pw in stored for pw in [*made.values(), renewed, "the instructor's own"])


def _sign_in_refusal(credentials, accounts, name, password) -> str:
    with pytest.raises(room.SignInRefused) as refused:
        credentials.sign_in(accounts, name, password)
    return str(refused.value)


def test_a_refused_sign_in_says_why_and_what_to_do(tmp_path):
    credentials = room.Credentials(tmp_path / "passwords.json", min_length=8)
    accounts = ("student01", "student02", "instructor")
    made = credentials.hand_out(accounts[:2])
    assert credentials.sign_in(accounts, "student01", made["student01"]) == "student01"
    assert _sign_in_refusal(credentials, accounts, "studnet01", made["student01"]) == (
        "'studnet01' is not an account of this room: use the name on your slip (e.g. student07), or ask the instructor")
    assert _sign_in_refusal(credentials, accounts, "instructor", "any long password") == (
        "instructor has no password yet: ask the instructor")
    assert _sign_in_refusal(credentials, accounts, "student01", "short") == (
        "that password is 5 characters, and every password here is 8 or more: type the one on your slip, "
        "or ask the instructor")
    assert _sign_in_refusal(credentials, accounts, "student02", made["student01"]) == (
        "that is not the password of student02: type the one on your slip, or ask the instructor")


def _authenticator(tmp_path, accounts):
    # Not a hidden failure: `make test` installs the dev extra, JupyterHub with it, so this runs there;
    # only a GPU host's own python3, which has no JupyterHub, skips it.
    pytest.importorskip("jupyterhub", reason="JupyterHub comes with the dev extra that make test installs")
    sys.path.insert(0, str(ROOT / "hub"))
    try:
        from auth import WorkshopAuthenticator
    finally:
        sys.path.remove(str(ROOT / "hub"))
    return WorkshopAuthenticator(accounts=list(accounts), credentials_file=str(tmp_path / "passwords.json"),
                                 min_password_length=8, admin_users={"instructor"},
                                 allowed_users=set(accounts))


def test_nobody_signs_in_as_the_instructor_or_another_student_through_the_hubs_authenticator(tmp_path):
    """WorkshopAuthenticator as the hub runs it (get_authenticated_user, JupyterHub's own entry): before
    and after the organiser made the passwords, the instructor's account and each student's open to
    their own password alone; each refusal is an HTTP 403 whose message the login page shows."""
    import asyncio

    from tornado import web

    accounts = ("student01", "student02", "instructor")
    hub = _authenticator(tmp_path, accounts)

    def sign_in(name, password):
        return asyncio.run(hub.get_authenticated_user(None, {"username": name, "password": password}))

    def refused(name, password) -> str:
        with pytest.raises(web.HTTPError) as raised:
            sign_in(name, password)
        assert raised.value.status_code == 403
        return raised.value.get_message()

    # before the passwords are made, the first to come takes nothing
    for name in accounts:
        assert refused(name, "first come, first served") == f"{name} has no password yet: ask the instructor"
    made = room.Credentials(tmp_path / "passwords.json", 8).hand_out(accounts)
    for name in accounts:
        assert sign_in(name, made[name])["name"] == name
        for other in accounts:
            if other != name:
                assert refused(other, made[name]).startswith(f"that is not the password of {other}:")
        assert refused(name, made[name][:7]).startswith("that password is 7 characters")
        assert refused(name, made[name].upper()).startswith(f"that is not the password of {name}")
    assert sign_in("instructor", made["instructor"])["admin"] is True
    assert sign_in("student01", made["student01"])["admin"] in (None, False)
    assert refused("nobody", made["student01"]).startswith("'nobody' is not an account of this room")


def test_the_hub_does_not_open_while_an_account_has_no_password():
    config = (ROOT / "hub" / "jupyterhub_config.py").read_text()
    check = config.index("accounts have no password yet")
    assert config.index("credentials_file = settings.state / room.PASSWORDS") < check < config.index("room.ensure_account(")
    assert "c.JupyterHub.authenticator_class = WorkshopAuthenticator" in config
    assert "Passwords" not in config and "first login" not in (ROOT / "hub" / "settings.toml").read_text()


def test_a_folder_that_others_cannot_enter_is_named():
    tmp_path = Path(tempfile.mkdtemp())  # in the system's temporary folder, which every user enters
    open_folder = tmp_path / "open"
    (open_folder / "inner").mkdir(parents=True)
    (open_folder / "inner" / "file").write_text("x")
    for folder in (tmp_path, open_folder, open_folder / "inner"):
        folder.chmod(0o755)
    (open_folder / "inner" / "file").chmod(0o644)
    assert room.readable_by_everyone(open_folder / "inner" / "file") is None
    open_folder.chmod(0o700)
    assert room.readable_by_everyone(open_folder / "inner" / "file") == open_folder
    open_folder.chmod(0o755)
    (open_folder / "inner" / "file").chmod(0o600)
    assert room.readable_by_everyone(open_folder / "inner" / "file") == open_folder / "inner" / "file"
    shutil.rmtree(tmp_path)


def test_limits_on_cgroup_v2(tmp_path, monkeypatch):
    monkeypatch.setattr(room, "CGROUP", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / room.GROUP).mkdir()
    (tmp_path / room.GROUP / "cgroup.subtree_control").write_text("")
    procs = room.make_limits("student01", memory_gb=1.5, cpus=0.5)
    folder = tmp_path / room.GROUP / "student01"
    assert procs == [folder / "cgroup.procs"] and room.limit_folders("student01") == [folder]
    assert (folder / "memory.max").read_text() == str(int(1.5 * 2**30))
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "cpu.max").read_text() == "50000 100000"
    assert (tmp_path / room.GROUP / "cgroup.subtree_control").read_text() == "+memory +cpu"
    room.make_limits("student02", memory_gb=0, cpus=0)
    assert (tmp_path / room.GROUP / "student02" / "memory.max").read_text() == "max"
    assert (tmp_path / room.GROUP / "student02" / "cpu.max").read_text() == "max 100000"


def test_limits_on_cgroup_v1_go_below_the_hubs_own_cgroups(tmp_path, monkeypatch):
    monkeypatch.setattr(room, "CGROUP", tmp_path)
    monkeypatch.setattr(room, "_own_v1", lambda controller: f"outer/{controller}-box")
    (tmp_path / "memory").mkdir()
    (tmp_path / "cpu").mkdir()
    procs = room.make_limits("student01", memory_gb=2, cpus=1)
    memory = tmp_path / "memory" / "outer" / "memory-box" / room.GROUP / "student01"
    cpu = tmp_path / "cpu" / "outer" / "cpu-box" / room.GROUP / "student01"
    assert procs == [memory / "cgroup.procs", cpu / "cgroup.procs"]
    assert (memory / "memory.limit_in_bytes").read_text() == str(2 * 2**30)
    assert (cpu / "cpu.cfs_quota_us").read_text() == "100000"


def test_without_cgroups_the_limits_cannot_be_made(tmp_path, monkeypatch):
    monkeypatch.setattr(room, "CGROUP", tmp_path)
    assert room.cgroup_version() is None and room.limit_folders("student01") == []
    with pytest.raises(OSError, match="no cgroup v2 hierarchy and no v1 memory and cpu controllers"):
        room.make_limits("student01", memory_gb=1, cpus=1)


def test_make_hub_and_hub_test_use_the_settings_and_the_load_test():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("hub", "hub-test", "hub-accounts", "hub-password", "hub-prework", "hub-catch-up"):
        assert re.search(rf"^{target}: hub-as-root \$\(HUB_STAMP\)$", makefile, re.M), target
    assert re.search(r"^hub-clean: hub-as-root$", makefile, re.M)
    hub = makefile.split("\nhub: ")[1].split("\n\n")[0]
    assert hub.index("hub/accounts.py hand-out") < hub.index("$(HUB_VENV)/bin/jupyterhub -f hub/jupyterhub_config.py")
    assert "hub/load_test.py --students $(HUB_STUDENTS)" in makefile
    assert re.search(r"^HUB_STUDENTS \?= (\d+)$", makefile, re.M).group(1) == "8"
    # the hub's environment comes from the same install as .venv, so it takes the same route without
    # PyTorch's CPU index (no pip line of its own that pins a triton PyPI's torch does not take)
    stamp = makefile.split("$(HUB_STAMP): pyproject.toml constraints.txt\n")[1].split("\n\n")[0]
    assert "sh tools/install.sh $(HUB_PYTHON) $(HUB_VENV) '$(TORCH_INDEX)' lab,hub" in stamp
    assert "pip install" not in stamp


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")  # `make test` runs it, so it has make
def test_a_hub_target_run_as_a_user_says_in_one_line_how_to_run_it_as_root(tmp_path):
    user = tmp_path / "bin"
    user.mkdir()
    (user / "id").write_text("#!/bin/sh\necho 1000\n")  # `id -u` of a user, whoever runs the test
    (user / "id").chmod(0o755)
    alone = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    alone["PATH"] = f"{user}:{alone['PATH']}"
    for target in ("hub", "hub-clean"):
        done = subprocess.run(["make", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True, env=alone)
        assert done.returncode != 0 and done.stderr.splitlines()[0] == (
            f"c2graph hub: make {target} runs as root (it makes one Unix account per student): run it as root, "
            f"or as 'sudo make {target}'"), done.stderr


def test_an_account_is_listed_only_when_the_hub_made_it_and_removed_without_procps(tmp_path, monkeypatch):
    """ensure_account lists the accounts it made (make hub-clean removes those and no other);
    remove_account finds their processes in /proc (a bare Debian has no pgrep) and takes an account
    that is already gone in its stride."""
    made, calls, existing = tmp_path / "accounts-made", [], {"alice"}
    home = tmp_path / "home"
    home.mkdir()

    def getpwnam(name):
        if name not in existing:
            raise KeyError(name)
        return room.pwd.struct_passwd((name, "x", 1001, 1001, "", str(home), "/bin/bash"))

    def run(command, **kw):
        calls.append(command)
        existing.add(command[-1])

    monkeypatch.setattr(room.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(room.subprocess, "run", run)
    room.ensure_account("alice", made)  # there already: not the hub's
    room.ensure_account("student01", made)
    room.ensure_account("student01", made)
    assert made.read_text() == "student01\n" and calls[0][0] == "useradd" and len(calls) == 1

    assert os.getpid() in room.processes_of(os.getuid()) and room.processes_of(2**31 - 7) == []
    calls.clear()
    room.remove_account("hubtest99")  # no such account: nothing to end, no userdel
    assert calls == []
    load_test = (ROOT / "hub" / "load_test.py").read_text()
    assert "pgrep" not in load_test + (ROOT / "hub" / "room.py").read_text()
    assert "except ProcessLookupError" in load_test and "torchinductor_" in load_test
    assert "finally:\n        if failures" in load_test and "clean_up(names + [ADMIN], hub_proc, state)" in load_test


def test_the_hub_makes_student_copies_with_student_py_run_as_a_file_without_torch(tmp_path):
    """The hub runs src/c2graph/workshop/student.py as a file, so that a room's sign-ins do not each
    import torch: it must import nothing of the package and keep what a student has."""
    config = (ROOT / "hub" / "jupyterhub_config.py").read_text()
    assert 'COPIES = room.REPOSITORY / "src" / "c2graph" / "workshop" / "student.py"' in config
    script = ROOT / "src" / "c2graph" / "workshop" / "student.py"
    assert not re.search(r"^from \.|^import c2graph|^from c2graph", script.read_text(), re.M)
    command = [sys.executable, "-X", "importtime", str(script), "--keep", str(ROOT / "notebooks"), str(tmp_path / "c2graph")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "nbformat" in imported and not imported & {"torch", "triton", "c2graph"}
    assert done.stdout.startswith(f"student copies in {tmp_path / 'c2graph'}/: ")


def test_the_instructor_sees_each_students_pre_work_from_their_saved_copies(tmp_path, monkeypatch):
    """make hub-prework: for every student, what their ~/c2graph shows, without the student's help."""
    spec = importlib.util.spec_from_file_location("prework", ROOT / "hub" / "prework.py")
    prework = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prework)
    copies = prework.student_module()
    homes = {"student01": tmp_path / "one", "student02": tmp_path / "two"}
    copies.add_missing_student_copies(ROOT / "notebooks", homes["student01"] / "c2graph")
    (full,) = (ROOT / "notebooks").glob("01_*.ipynb")
    done = homes["student01"] / "c2graph" / full.name
    nb = copies.nbformat.read(full, as_version=4)  # the solutions, with their saved pass
    copies.nbformat.write(nb, done)

    def getpwnam(name):
        if name not in homes:
            raise KeyError(name)
        return room.pwd.struct_passwd((name, "x", 1001, 1001, "", str(homes[name]), "/bin/bash"))

    monkeypatch.setattr(prework.pwd, "getpwnam", getpwnam)
    settings = room.load(_settings(tmp_path, count="3"))
    lines = prework.report(settings)
    checks = len(copies.progress(homes["student01"] / "c2graph")) - 1
    passed = len(copies.find_exercises(nb))
    assert lines[0] == f"student01: {passed} of {checks} checks pass"
    assert lines[1:2 + passed] == ["    00_tour.ipynb: set-up: not run"] + [
        f"    {full.name}: exercise {n}: pass" for n in range(1, passed + 1)]
    assert lines[-2:] == [f"student02: never signed in (no {homes['student02'] / 'c2graph'})",
                          "student03: no account yet (the hub makes it at its start)"]
    makefile = (ROOT / "Makefile").read_text()
    assert "@$(HUB_RUN) hub/prework.py\n" in makefile and "hub/prework.py --catch-up $(CATCH_UP) $(STUDENTS)" in makefile


def test_ci_runs_the_hub_test_with_eight_students_on_01_inside_fifteen_minutes():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.splitlines()[-1] == "timeout 900 make hub-test HUB_STUDENTS=8 HUB_NOTEBOOK=01_the_ratio2_compressor.ipynb"
    load_test = (ROOT / "hub" / "load_test.py").read_text()
    assert "signal.signal(signal.SIGTERM, stop_on_sigterm)" in load_test  # timeout's SIGTERM still cleans up
    assert "pool.shutdown(wait=False, cancel_futures=True)" in load_test


def readme_row(summary: dict) -> str:
    """The README's row of one stored `make hub-test` run (hub/results/)."""
    ready = [s["server_start_s"] for s in summary["per_student"]]
    peak = summary["peak_memory_gb"]
    finished = f"{sum(not s['errors'] for s in summary['per_student'])} of {summary['students']}"
    notebook = summary["notebook_s"]
    return (f"| {summary['students']} | {summary['notebook'][:2]} | {finished} | {summary['load_average_before'][0]:.1f} | "
            f"{min(ready):.0f} to {max(ready):.0f} s | {notebook['min']:.0f} to {notebook['max']:.0f} s | "
            f"{summary['wall_s']:.0f} s | {peak['min']:.2f} to {peak['max']:.2f} GB |")


def test_the_readmes_hub_rows_are_the_stored_runs():
    stored = sorted((ROOT / "hub" / "results").glob("*.json"))
    assert stored, "no stored make hub-test run in hub/results"
    readme = (ROOT / "README.md").read_text()
    notebooks = set()
    for path in stored:
        summary = json.loads(path.read_text())
        assert readme_row(summary) in readme, (path.name, readme_row(summary))
        assert f"`hub/results/{path.name}`" in readme, path.name
        notebooks.add(summary["notebook"][:2])
    assert "04" in notebooks  # the notebook with two data-parallel ranks a student


def test_make_hub_accounts_prints_each_new_password_once_and_hub_clean_removes_only_what_the_hub_made(
        tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("accounts", ROOT / "hub" / "accounts.py")
    accounts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(accounts)
    state = tmp_path / "state"
    monkeypatch.setenv("C2GRAPH_HUB_SETTINGS", str(_settings(tmp_path, count="2", state=f'"{state}"')))
    monkeypatch.setattr(accounts.os, "geteuid", lambda: 0)
    assert accounts.main(["hand-out"]) == 0
    out = capsys.readouterr().out
    made = dict(re.findall(r"name: +(\S+)\n +password: +(\S+)", out))
    assert set(made) == {"student01", "student02", "instructor"}
    sheet, = state.glob("sheet-*.txt")
    assert sheet.read_text() in out and stat.S_IMODE(sheet.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    credentials = room.Credentials(state / room.PASSWORDS, 8)
    assert all(credentials.check(name, password) for name, password in made.items())
    assert accounts.main(["hand-out"]) == 0 and "has its password already" in capsys.readouterr().out  # none printed again
    assert accounts.main(["reset", "student02"]) == 0
    new = dict(re.findall(r"name: +(\S+)\n +password: +(\S+)", capsys.readouterr().out))
    assert set(new) == {"student02"} and credentials.check("student02", new["student02"])
    assert accounts.main(["reset", "mallory"]) == 1
    assert "mallory: not an account of settings.toml" in capsys.readouterr().err
    (state / room.MADE_ACCOUNTS).write_text("student01\nstudent02\n")
    removed = []
    monkeypatch.setattr(accounts.room, "remove_account", removed.append)
    assert accounts.main(["clean"]) == 0
    assert removed == ["student01", "student02"] and not state.exists()
    monkeypatch.setattr(accounts.os, "geteuid", lambda: 1000)
    assert accounts.main(["hand-out"]) == 1
    assert capsys.readouterr().err == "c2graph hub: the room's accounts are root's: run it as root, or with sudo\n"


def test_the_hub_and_the_load_test_wait_for_a_room_of_twenty_on_two_cores():
    """20 students on notebook 04 on two cores: servers were ready after up to 261 s (stored run), and
    tornado's 20 s default gave up on 4 kernels' connections: both waits are longer now."""
    config = (ROOT / "hub" / "jupyterhub_config.py").read_text()
    start = int(re.search(r"^c\.Spawner\.start_timeout = (\d+)$", config, re.M).group(1))
    twenty = json.loads((ROOT / "hub" / "results" / "2026-12-06-04-20-students.json").read_text())
    assert start >= 2 * max(s["server_start_s"] for s in twenty["per_student"])
    load_test = (ROOT / "hub" / "load_test.py").read_text()
    assert re.search(r"^SERVER_TIMEOUT_S = (\d+)$", load_test, re.M).group(1) == str(start)
    assert "connect_timeout=CELL_TIMEOUT_S, request_timeout=CELL_TIMEOUT_S" in load_test
