"""The workshop hub's own pieces (hub/room.py), without JupyterHub: the settings file an instructor
edits, the passwords set at the first login, the GPU each student is given, the folders a student
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


def test_the_first_login_sets_the_password_and_later_ones_must_give_it(tmp_path):
    passwords = room.Passwords(tmp_path / "state" / "passwords.json", min_length=8)
    assert not passwords.check("student01", "short")  # too short to be set
    assert not (tmp_path / "state" / "passwords.json").exists()
    assert passwords.check("student01", "correct horse")
    assert passwords.check("student01", "correct horse")
    assert not passwords.check("student01", "correct horsE")
    assert passwords.check("student02", "another one") and not passwords.check("student02", "correct horse")
    stored = (tmp_path / "state" / "passwords.json")
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert set(json.loads(stored.read_text())) == {"student01", "student02"}
    assert "correct horse" not in stored.read_text()


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
    assert re.search(r"^hub: \$\(HUB_STAMP\)$", makefile, re.M) and re.search(r"^hub-test: \$\(HUB_STAMP\)$", makefile, re.M)
    assert "$(HUB_VENV)/bin/jupyterhub -f hub/jupyterhub_config.py" in makefile
    assert "hub/load_test.py --students $(HUB_STUDENTS)" in makefile
    assert re.search(r"^HUB_STUDENTS \?= (\d+)$", makefile, re.M).group(1) == "8"


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
