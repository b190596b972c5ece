"""The three places that name dependencies agree: pyproject.toml, constraints.txt, environment.yml."""

import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower()


def _pyproject() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = meta["dependencies"] + meta["optional-dependencies"]["dev"]
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


def test_environment_yml_names_the_same_dependencies_at_the_same_versions():
    text = (ROOT / "environment.yml").read_text()
    pip_section = text.split("- pip:")[1].splitlines()
    env_pins = _pins(pip_section)
    assert env_pins == _pins((ROOT / "constraints.txt").read_text().splitlines())
    assert "-e .[dev]" in text
    assert re.search(r"^\s*- python=3\.\d+", text, re.M)


@pytest.mark.skipif(
    not (Path(sys.prefix) / ".installed").exists(),
    reason="not the project's .venv (e.g. a GPU host's own python3, which need not have jupyterlab)",
)
def test_installed_versions_satisfy_pyproject_ranges():
    from importlib.metadata import version

    from packaging.requirements import Requirement

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in map(Requirement, meta["dependencies"] + meta["optional-dependencies"]["dev"]):
        assert req.specifier.contains(version(req.name).split("+")[0]), (req, version(req.name))
