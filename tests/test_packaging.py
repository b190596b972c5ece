"""How the package is installed: the three places that name dependencies agree (pyproject.toml,
constraints.txt, environment.yml); the set-up check says in one line what to install before
anything is written; the Containerfile runs the README's two commands."""

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower()


def _pyproject() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = meta["dependencies"] + [r for extra in meta["optional-dependencies"].values() for r in extra]
    return {_name(r) for r in reqs}


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip().lstrip("- ").strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_constraints_pin_every_dependency():
    pins = _pins((ROOT / "constraints.txt").read_text().splitlines())
    assert set(pins) == _pyproject()


def test_the_library_needs_torch_triton_and_numpy_and_the_rest_are_extras_each_target_installs():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {_name(r) for r in meta["dependencies"]} == {"torch", "triton", "numpy"}
    extras = {k: {_name(r) for r in v} for k, v in meta["optional-dependencies"].items()}
    assert extras["lab"] >= {"jupyterlab", "matplotlib", "ipywidgets", "tqdm"}
    assert extras["dev"] >= {"pytest", "nbval", "hypothesis", "playwright", "jupyterhub"}
    assert extras["hub"] == {"jupyterhub"}
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^EXTRAS \?= lab,dev$", makefile, re.M)
    assert "@sh tools/install.sh $(PYTHON) $(VENV) '$(TORCH_INDEX)' $(EXTRAS)" in makefile
    assert "@sh tools/install.sh $(HUB_PYTHON) $(HUB_VENV) '$(TORCH_INDEX)' lab,hub" in makefile
    # every target that runs JupyterLab, the tests, nbconvert or the student copies stands on .venv's install
    for target in ("lab", "workshop", "test", "unit", "nbval", "notebooks", "figures", "student", "catch-up",
                   "progress", "browser-test"):
        assert re.search(rf"^{target}: \$\(STAMP\)$", makefile, re.M), target
    assert "make .venv/.installed EXTRAS=lab,dev${HUB:+,hub}" in _containerfile()
    assert "pip install" not in _containerfile()
    # notebook 00's set-up check reads the notebooks' packages from the lab extra
    from c2graph.workshop import setup_check
    assert setup_check.EXTRA == "lab"
    assert set(setup_check.NEEDED) <= {"torch", "triton"} | extras["lab"]


def test_environment_yml_gives_python_and_make_and_leaves_the_versions_to_constraints():
    text = (ROOT / "environment.yml").read_text()
    deps = re.findall(r"^  - (\S+)$", text.split("dependencies:")[1], re.M)
    assert deps == ["python=3.11", "pip", "make"]
    assert "- pip:" not in text
    assert "conda activate c2graph && make lab" in text


# Not a hidden failure: `make test` runs inside the project's .venv, where this runs; a GPU host's
# own python3 has other versions on purpose (the tests there run against its torch).
@pytest.mark.skipif(
    not (Path(sys.prefix) / ".installed").exists(),
    reason="not the project's .venv (e.g. a GPU host's own python3, which need not have jupyterlab)",
)
def test_installed_versions_satisfy_pyproject_ranges():
    from importlib.metadata import version

    from packaging.requirements import Requirement

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    for req in map(Requirement, meta["dependencies"] + extras["lab"] + extras["dev"]):
        assert req.specifier.contains(version(req.name).split("+")[0]), (req, version(req.name))


# --- the set-up check (tools/check-setup.sh), run with a PATH of stand-ins ------------------------

CHECK = ROOT / "tools" / "check-setup.sh"
VERSION = "%d.%d" % sys.version_info[:2]


def _script(path: Path, text: str) -> None:
    path.write_text("#!/bin/sh\n" + text + "\n")
    path.chmod(0o755)


def _bin(tmp_path, *, uid=1000, system="Linux", apt=True, python="no ensurepip") -> Path:
    """A folder that is all of PATH: `id -u` answers uid, `uname -s` answers system, apt-get is
    there or not, and python3 is this Python, this Python without ensurepip, or missing."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("sh", "rm"):
        (folder / tool).symlink_to(shutil.which(tool))
    _script(folder / "id", f"echo {uid}")
    _script(folder / "uname", f'[ "$1" = -s ] && {{ echo {system}; exit 0; }}\nexec {shutil.which("uname")} "$@"')
    if apt:
        _script(folder / "apt-get", "exit 0")
    if python != "missing":
        shadow = tmp_path / "shadow"
        shadow.mkdir()
        if python == "no ensurepip":  # as on Debian and Ubuntu without python3.X-venv
            (shadow / "ensurepip.py").write_text("raise ModuleNotFoundError(\"No module named 'ensurepip'\")\n")
        _script(folder / "python3", f'PYTHONPATH={shadow} exec {sys.executable} "$@"')
    return folder


def _check(tmp_path, folder, venv=".venv"):
    return subprocess.run(["sh", str(CHECK), "python3", venv], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": str(folder), "HOME": str(tmp_path)})


def _readme_line() -> str:
    """The line the README quotes for a Debian without python3-venv, for this Python's version."""
    block = re.search(r"```text\n(c2graph set-up: .*)\n```", (ROOT / "README.md").read_text())
    return block.group(1).replace("3.11", VERSION)


@pytest.mark.parametrize("uid, install", [(1000, "sudo apt-get install -y"), (0, "apt-get install -y")])
def test_without_ensurepip_one_line_names_the_versioned_venv_package(tmp_path, uid, install):
    done = _check(tmp_path, _bin(tmp_path, uid=uid))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [_readme_line().replace("sudo apt-get install -y", install)]
    assert f"'{install} python{VERSION}-venv'" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_without_apt_the_line_names_the_missing_module(tmp_path):
    done = _check(tmp_path, _bin(tmp_path, apt=False))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"c2graph set-up: python3 ({VERSION}) cannot create .venv: its ensurepip module is missing; "
        "install the package of your system that provides it, then run make again"]


def test_without_python3_the_line_names_python3_and_its_venv(tmp_path):
    done = _check(tmp_path, _bin(tmp_path, python="missing"))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "c2graph set-up: no python3 here: run 'sudo apt-get install -y python3 python3-venv', then run make again"]


def test_on_macos_the_line_points_to_the_container_section(tmp_path):
    done = _check(tmp_path, _bin(tmp_path, system="Darwin", python="whole"))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "c2graph set-up: Triton publishes wheels for Linux only and this is Darwin: "
        "run the container or WSL (README, section 'macOS and Windows')"]
    assert "\n## macOS and Windows\n" in (ROOT / "README.md").read_text()


def test_a_half_made_venv_is_removed_so_it_is_made_afresh(tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to(tmp_path / "gone")  # what a failed `python3 -m venv` leaves
    done = _check(tmp_path, _bin(tmp_path, python="whole"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "c2graph set-up: .venv has no working pip (an earlier run stopped half-way): making it afresh\n"
    assert not venv.exists()


def test_a_working_venv_and_a_folder_that_is_no_venv_are_kept(tmp_path):
    pytest.importorskip("pip", reason="this Python has no pip to stand in for a working .venv's")  # every .venv has it
    working = tmp_path / "working"
    (working / "bin").mkdir(parents=True)
    (working / "pyvenv.cfg").write_text("home = /usr/bin\n")
    _script(working / "bin" / "python", f'exec {sys.executable} "$@"')
    done = _check(tmp_path, _bin(tmp_path, python="whole"), venv="working")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert (working / "pyvenv.cfg").exists()

    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    done = _check(tmp_path, tmp_path / "bin", venv="notes")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "c2graph set-up: notes exists and is no virtual environment: move it away, "
        "or name another, e.g. 'make test VENV=.venv-c2graph'"]
    assert (other / "mine.txt").read_text() == "keep me"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")  # `make test` runs it, so it has make
def test_make_runs_the_check_first_and_stops_before_any_venv(tmp_path):
    venv = tmp_path / "v"
    alone = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # not as `make test`'s child
    planned = subprocess.run(["make", "--no-print-directory", "-n", "lab", f"VENV={venv}"], cwd=ROOT,
                             capture_output=True, text=True, env=alone)
    assert planned.stdout.splitlines()[:2] == [f"sh tools/check-setup.sh python3 {venv}",
                                               f"sh tools/install.sh python3 {venv} '{CPU_INDEX}' lab,dev"]

    folder = _bin(tmp_path)
    (folder / "make").symlink_to(shutil.which("make"))
    done = subprocess.run(["make", "--no-print-directory", f"{venv}/.installed", f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": str(folder), "HOME": str(tmp_path)})
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.splitlines()[0] == _readme_line().replace(".venv", str(venv))
    assert not venv.exists()


# --- the install (tools/install.sh): the CPU index when it answers, else pip's own index ---------

INSTALL = ROOT / "tools" / "install.sh"
CPU_INDEX = re.search(r"^TORCH_INDEX \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def _stand_in_python(tmp_path, pip_fails=False) -> Path:
    """A `python3` whose `-m venv V` makes V/bin/python: this Python, except that `-m pip` only
    writes its arguments to pip.log (and fails when pip_fails), so no package is installed."""
    log = tmp_path / "pip.log"
    inner = (f'if [ "$1 $2" = "-m pip" ]; then shift 2; echo "$@" >> {log}; '
             f'{"exit 1" if pip_fails else "exit 0"}; fi\nexec {sys.executable} "$@"')
    outer = tmp_path / "python3"
    _script(outer, f'[ "$1 $2" = "-m venv" ] || exec {sys.executable} "$@"\n'
                   f'mkdir -p "$3/bin" && cat > "$3/bin/python" <<\'EOF\'\n#!/bin/sh\n{inner}\nEOF\n'
                   f'chmod +x "$3/bin/python"')
    return outer


def _install(tmp_path, index, pip_fails=False, extras=()):
    python = _stand_in_python(tmp_path, pip_fails)
    venv = tmp_path / "v"
    done = subprocess.run(["sh", str(INSTALL), str(python), str(venv), index, *extras], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    log = (tmp_path / "pip.log").read_text().splitlines() if (tmp_path / "pip.log").exists() else []
    return done, log, venv


class _Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200 if self.path == "/cpu/torch/" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_an_index_that_answers_gives_torch_and_nothing_else(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_port}/cpu"
        done, log, _ = _install(tmp_path, index)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"c2graph set-up: torch from PyTorch's CPU index ({index})"
    assert log[1] == f"install --quiet -c constraints.txt --index-url {index} torch"
    assert log[2] == "install --quiet -c constraints.txt -e .[lab,dev]"


def test_an_index_that_does_not_answer_takes_pips_own_with_the_triton_torch_requires(tmp_path):
    started = time.monotonic()
    done, log, venv = _install(tmp_path, "http://127.0.0.1:9/cpu")  # nothing listens on port 9
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    first = done.stdout.splitlines()[0]
    assert first.startswith("c2graph set-up: PyTorch's CPU index (http://127.0.0.1:9/cpu) did not answer within 5 s (")
    assert first.endswith("): torch from pip's own index, with the triton it requires")
    free = venv / "constraints-pip-index.txt"
    assert log[1:] == [f"install --quiet -c {free} torch", f"install --quiet -c {free} -e .[lab,dev]"]
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert free.read_text().splitlines() == [line for line in pins if not line.startswith("triton==")]
    assert done.stdout.splitlines()[-1].startswith("c2graph set-up: installed torch ")

    done, log, _ = _install(tmp_path, "")
    assert done.stdout.splitlines()[0] == ("c2graph set-up: torch from pip's own index (TORCH_INDEX is empty), "
                                           "with the triton it requires")

    # the hub's environment takes the same route, with its extras: no triton pin PyPI's torch refuses
    (tmp_path / "pip.log").unlink()
    done, log, venv = _install(tmp_path, "http://127.0.0.1:9/cpu", extras=["lab,hub"])
    assert done.returncode == 0, done.stderr
    assert log[1:] == [f"install --quiet -c {free} torch", f"install --quiet -c {free} -e .[lab,hub]"]


def test_a_pip_that_fails_ends_with_one_line_that_says_what_to_do(tmp_path):
    done, log, _ = _install(tmp_path, "", pip_fails=True)
    assert done.returncode == 1 and len(log) == 1
    assert done.stderr.splitlines() == [
        "c2graph set-up: pip could not reach its index to update itself (its error is above): check this "
        "machine's network (and pip's proxy or certificates, if it needs them: 'pip config list'), then run make again"]


# --- the Containerfile: the README's two commands in a Debian with Python 3.11 ---------------------

def _containerfile() -> str:
    return (ROOT / "Containerfile").read_text()


def _jupyter_config() -> dict:
    return json.loads(re.search(r"echo '(\{.*\})'", _containerfile()).group(1))


def test_the_image_is_debian_bookworm_with_what_the_readme_says_to_install():
    recipe = _containerfile()
    assert re.search(r"^FROM debian:bookworm(-slim)?$", recipe, re.M)
    packages = re.search(r"apt-get install -y --no-install-recommends ([\w .-]+?) \\", recipe).group(1).split()
    assert set(packages) == {"make", "python3", "python3-venv"}
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"install first:\n\n```bash\n(.*)\n", readme).group(1)
    assert line.startswith('S=$([ "$(id -u)" = 0 ] || echo sudo); $S apt-get update && $S apt-get install -y ')
    assert {"make", "python3-venv", "git"} <= set(line.split("install -y ")[1].split())


def test_the_image_installs_from_the_dependency_files_before_it_copies_the_rest():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^VENV\s+\?= \.venv$", makefile, re.M) and re.search(r"^STAMP\s+:= \$\(VENV\)/\.installed$", makefile, re.M)
    assert re.search(r"^lab: \$\(STAMP\)$", makefile, re.M) and re.search(r"^test: \$\(STAMP\)$", makefile, re.M)
    steps = [line for line in _containerfile().splitlines() if re.match(r"(COPY|RUN|ENV) ", line)]
    copies = [line for line in steps if line.startswith("COPY")]
    assert copies == ["COPY Makefile pyproject.toml constraints.txt README.md ./", "COPY tools/ tools/", "COPY . ."]
    install = next(i for i, line in enumerate(steps) if "make .venv/.installed" in line)
    assert steps.index("COPY tools/ tools/") < install < steps.index("COPY . .")
    assert "ENV PIP_NO_CACHE_DIR=1" in steps[:install]
    assert steps[-1] == 'RUN touch .venv/.installed && .venv/bin/python -c "import c2graph"'
    assert re.search(r'^CMD \["make", "workshop"\]$', _containerfile(), re.M)


def test_jupyterlab_listens_on_the_published_port_of_every_interface():
    config = _jupyter_config()["ServerApp"]
    assert config == {"ip": "0.0.0.0", "port": 8888, "port_retries": 0, "open_browser": False}
    assert re.search(rf"^EXPOSE {config['port']}$", _containerfile(), re.M)
    serverapp = pytest.importorskip("jupyter_server.serverapp")  # in `make test`'s .venv (jupyterlab); not on a GPU host
    assert set(config) <= set(serverapp.ServerApp.class_trait_names())


def test_the_readme_builds_the_image_and_keeps_the_student_copies_on_the_host():
    section = (ROOT / "README.md").read_text().split("## macOS and Windows")[1].split("\n## ")[0]
    commands = re.search(r"\*\*The container\.\*\*.*?```bash\n(.*?)```", section, re.S).group(1)
    lines = [line.split("#")[0].strip() for line in commands.splitlines()]
    port = _jupyter_config()["ServerApp"]["port"]
    workdir = re.search(r"^WORKDIR (\S+)$", _containerfile(), re.M).group(1)
    student = re.search(r"^STUDENT \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert lines == ["podman build -t c2graph .", "mkdir -p student",
                     f'podman run --rm -it --init -p {port}:{port} -v "$PWD/student:{workdir}/{student}" c2graph',
                     f"podman run --rm -it --init -p {port}:{port} c2graph make lab",
                     "podman run --rm --init c2graph make test"]
    assert "docker build -t c2graph -f Containerfile ." in commands
    assert f"http://127.0.0.1:{port}/lab?token=" in section


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")  # `make test` runs it, so it has make
def test_make_lab_and_make_workshop_take_the_port_and_workshop_keeps_the_copies():
    alone = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    for target, folder in (("lab", "notebooks"), ("workshop", "student")):
        planned = subprocess.run(["make", "--no-print-directory", "-n", target, "PORT=8890", "VENV=/nonexistent",
                                  "-o", "/nonexistent/.installed"], cwd=ROOT, capture_output=True, text=True, env=alone)
        last = planned.stdout.splitlines()[-1]
        assert last.startswith(f"/nonexistent/bin/jupyter lab {folder} --port 8890"), planned.stdout
    assert f"-m c2graph.workshop.student --keep notebooks student" in planned.stdout


def test_the_readmes_commands_paste_as_they_stand_as_root_and_as_a_user():
    """No placeholder that breaks a paste (an apostrophe, angle brackets), no bare `sudo` before make or
    git (a bare Debian's root has none): `$S`, empty as root; the repository's URL is one REPO= line."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    assert "<this repository's URL>" not in readme and "sudo make" not in readme.replace("'sudo make", "")
    assert not [c for c in commands if c.startswith("sudo ") and "apt-get" not in c], commands  # WSL's user has sudo
    clones = [c for c in commands if "git clone" in c]
    assert clones and all('git clone "$REPO" ' in c for c in clones)
    for block in blocks:
        if "git clone" in block:
            assert re.search(r"^REPO=\S+ +# replace with this repository's URL$", block, re.M), block
        if "$S " in block and "S=$(" not in block.split("$S ")[0]:
            raise AssertionError(f"$S used before it is set: {block}")
    assert "$S make hub" in readme and 'S=$([ "$(id -u)" = 0 ] || echo sudo)' in readme
    assert not re.search(r"\b\d+ tests\b", readme), "a test count make test does not hold"


def test_scripts_keep_lf_endings_on_every_checkout():
    if shutil.which("git") is None or not (ROOT / ".git").exists():  # CI and `make test` run in a clone: it runs
        pytest.skip("not a git checkout")
    scripts = ["tools/check-setup.sh", "tools/install.sh", "Makefile", "Containerfile", ".ci/run"]
    scripts += [str(p.relative_to(ROOT)) for p in (ROOT / "hub").glob("*") if p.is_file()]
    attrs = subprocess.run(["git", "check-attr", "eol", "--", *scripts], cwd=ROOT, capture_output=True, text=True)
    assert attrs.stdout.splitlines() == [f"{path}: eol: lf" for path in scripts]
    for path in scripts:
        assert b"\r\n" not in (ROOT / path).read_bytes(), path


def test_the_image_leaves_out_this_machines_venv_and_caches():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "**/__pycache__", "student"} <= ignored


# --- notebook 00's set-up check against constraints.txt's pins --------------------------------------

def test_the_setup_check_names_a_torch_or_triton_that_is_not_the_pinned_one():
    from c2graph.workshop import setup_check

    pins = _pins((ROOT / "constraints.txt").read_text().splitlines())
    assert setup_check.pinned_versions() == {name: pins[name] for name in ("torch", "triton")}
    same = {"torch": pins["torch"] + "+cpu", "triton": pins["triton"]}
    assert setup_check.pin_notes(installed=same) == []
    (note,) = setup_check.pin_notes(installed={**same, "triton": "3.7.1"})
    assert note.startswith(f"triton 3.7.1 is installed where constraints.txt pins {pins['triton']} (")
    ready = str(setup_check.SetupReport([], [note]))
    assert ready.startswith("ready: ") and ready.endswith("; but " + note) and "\n" not in ready
    assert str(setup_check.SetupReport([], [])) == str(setup_check.SetupReport())
    assert setup_check.pin_notes(installed={"torch": None, "triton": None}) == []  # not installed: a problem, not a note
    assert setup_check.in_project_venv() == (Path(sys.prefix) / ".installed").is_file()


def test_nbval_compares_notebook_00s_set_up_line_without_the_version_note():
    """On the route without PyTorch's CPU index, triton is not the pinned one: the note after "ready"
    says so, and notebooks/sanitize.cfg removes it before nbval compares 00's stored line."""
    from c2graph.workshop import setup_check
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns((ROOT / "notebooks" / "sanitize.cfg").read_text())
    notes = setup_check.pin_notes(installed={"torch": "2.13.0+cu130", "triton": "3.7.1"}, pins={"torch": "2.12.0", "triton": "3.9.0"})
    assert len(notes) == 2
    noted, plain = str(setup_check.SetupReport([], notes)), str(setup_check.SetupReport())
    for regex, replace in patterns:
        noted, plain = re.sub(regex, replace, noted), re.sub(regex, replace, plain)
    assert noted == plain
