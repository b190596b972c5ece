"""The pre-work, as the instructor sees it on the hub (`make hub-prework`, as root): for each student
of hub/settings.toml, what the saved copies in their ~/c2graph show: notebook 00's set-up line and
each check's last verdict (JupyterLab saves a notebook with its outputs every two minutes).

    python hub/prework.py                              # every student, one block each
    python hub/prework.py --catch-up 02:1,2 NAME...    # 02's puzzles 1 and 2 into these students' copies

The catch-up runs as each student (their files stay theirs) and fills only the cells still as handed
out; a student reopens 02 (or reloads it from disk) to see them.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import room  # noqa: E402  (hub/room.py, beside this file)

COPIES = room.REPOSITORY / "src" / "c2graph" / "workshop" / "student.py"
"""Run and imported as a file: it needs nbformat alone, not torch."""


def student_module():
    spec = importlib.util.spec_from_file_location("c2graph_student_copies", COPIES)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def report(settings: room.Settings) -> list[str]:
    """One block per student: their account, then what their copies show (or why nothing)."""
    copies, lines = student_module(), []
    for name in settings.students:
        try:
            folder = Path(pwd.getpwnam(name).pw_dir) / "c2graph"
        except KeyError:
            lines.append(f"{name}: no account yet (the hub makes it at its start)")
            continue
        found = copies.progress(folder) if folder.is_dir() else []
        done = sum(line.endswith(": pass") for line in found)
        checks = sum(": exercise " in line for line in found)
        lines.append(f"{name}: {done} of {checks} checks pass" if found else f"{name}: never signed in (no {folder})")
        lines += [f"    {line}" for line in found if ": set-up: " in line or not line.endswith(": not run")]
    return lines


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        print("c2graph hub: the students' homes are theirs: run it as root, or with sudo", file=sys.stderr)
        return 1
    settings = room.load(Path(os.environ.get("C2GRAPH_HUB_SETTINGS", room.SETTINGS)))
    if argv[:1] != ["--catch-up"]:
        print("\n".join(report(settings)))
        return 0
    if len(argv) < 3:
        print('c2graph hub: name the students, e.g. make hub-catch-up STUDENTS="student07 student12"', file=sys.stderr)
        return 2
    failed = 0
    for name in argv[2:]:
        if name not in settings.students:
            print(f"c2graph hub: {name} is not a student of {room.SETTINGS.name}", file=sys.stderr)
            failed = 1
            continue
        home = pwd.getpwnam(name).pw_dir
        done = subprocess.run([sys.executable, str(COPIES), "--catch-up", argv[1], str(room.REPOSITORY / "notebooks"),
                               os.path.join(home, "c2graph")], user=name, group=name, extra_groups=[],
                              capture_output=True, text=True, cwd=home)
        print("\n".join(f"{name}: {line}" for line in (done.stdout + done.stderr).strip().splitlines()))
        failed |= done.returncode != 0
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
