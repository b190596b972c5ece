"""The workshop hub's pieces that need no JupyterHub: its settings, the students' accounts and
passwords, the GPU each student is given, and the cgroups that hold each student's limits.

``hub/jupyterhub_config.py`` builds the hub from these; ``tests/test_hub.py`` tests them alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import secrets
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
SETTINGS = HERE / "settings.toml"
CGROUP = Path("/sys/fs/cgroup")
GROUP = "c2graph-hub"
"""The cgroup (v2), or the cgroup below the hub's own in each controller (v1), that holds one
cgroup per student."""


class SettingsError(ValueError):
    """A setting that cannot work, said in one line with the file and the key."""


@dataclass(frozen=True)
class Settings:
    ip: str
    port: int
    state: Path
    students: tuple[str, ...]
    admins: tuple[str, ...]
    min_password_length: int
    memory_gb: float
    cpus: float
    gpus: tuple[int, ...]

    def gpu_of(self, name: str) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` of account ``name``: one device of :attr:`gpus`, round robin
        over the students in order (admins after them); ``""`` (no GPU) when :attr:`gpus` is empty."""
        if not self.gpus:
            return ""
        order = self.students + tuple(a for a in self.admins if a not in self.students)
        return str(self.gpus[order.index(name) % len(self.gpus)])


def load(path: Path = SETTINGS) -> Settings:
    """Read and check ``path`` (TOML); a :class:`SettingsError` names the first bad key."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"{path}: cannot be read ({e})") from None

    def get(section: str, key: str, kind, check=lambda v: True, expected=""):
        value = raw.get(section, {}).get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
            raise SettingsError(f"{path}: [{section}] {key} = {value!r}, expected {expected}")
        return value

    def account(name) -> bool:
        return isinstance(name, str) and name.isascii() and name[:1].isalpha() and name.replace("_", "").isalnum() \
            and name == name.lower() and len(name) <= 32

    prefix = get("students", "prefix", str, account, "a lower-case name of letters and digits")
    count = get("students", "count", int, lambda v: 0 <= v <= 999, "a number of students, 0 to 999")
    names = get("students", "names", list, lambda v: all(map(account, v)), "a list of lower-case account names")
    admins = get("students", "admins", list, lambda v: all(map(account, v)), "a list of lower-case account names")
    students = tuple(f"{prefix}{k:02d}" for k in range(1, count + 1)) + tuple(names)
    if not students:
        raise SettingsError(f"{path}: [students] gives no student (count = 0 and names = [])")
    return Settings(
        ip=get("hub", "ip", str, expected='"" (every interface) or an address'),
        port=get("hub", "port", int, lambda v: 0 < v < 65536, "a port, 1 to 65535"),
        state=Path(get("hub", "state", str, lambda v: v.startswith("/"), "an absolute path")),
        students=students,
        admins=tuple(admins),
        min_password_length=get("students", "min_password_length", int, lambda v: v >= 1, "a length, 1 or more"),
        memory_gb=float(get("limits", "memory_gb", (int, float), lambda v: v >= 0, "gigabytes, 0 for no limit")),
        cpus=float(get("limits", "cpus", (int, float), lambda v: v >= 0, "CPUs, 0 for no limit")),
        gpus=tuple(get("gpus", "devices", list, lambda v: all(isinstance(d, int) and d >= 0 for d in v),
                       "a list of CUDA device numbers, [] for none")),
    )


# --- passwords: set at the first login, kept as salted scrypt hashes ---------------------------------

class Passwords:
    """``name -> salted scrypt hash`` in a JSON file that only root reads (mode 600)."""

    def __init__(self, path: Path, min_length: int):
        self.path, self.min_length = Path(path), min_length

    def _read(self) -> dict[str, str]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    @staticmethod
    def _hash(password: str, salt: bytes) -> str:
        return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1).hex()

    def check(self, name: str, password: str) -> bool:
        """True when ``password`` is ``name``'s, or sets it when ``name`` has none yet (and it is
        long enough); False otherwise."""
        stored = self._read()
        if name in stored:
            salt, digest = stored[name].split(":")
            return hmac.compare_digest(self._hash(password, bytes.fromhex(salt)), digest)
        if len(password) < self.min_length:
            return False
        salt = secrets.token_bytes(16)
        stored[name] = f"{salt.hex()}:{self._hash(password, salt)}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(stored, indent=1))
        temporary.chmod(0o600)
        temporary.replace(self.path)
        return True


# --- accounts: one Unix user per student, a home only they can read ------------------------------

def ensure_account(name: str) -> pwd.struct_passwd:
    """The Unix account ``name``, made (with a home of mode 700) when it does not exist."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name], check=True)
        account = pwd.getpwnam(name)
    os.chmod(account.pw_dir, 0o700)
    return account


def readable_by_everyone(path: Path) -> Path | None:
    """The first place on the way to ``path`` (links followed) that other users cannot enter or
    read, or ``None`` when every user can."""
    path = Path(path).resolve()
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & 0o001:
            return folder
    mode = os.stat(path).st_mode
    return None if mode & 0o004 and (mode & 0o001 or not path.is_dir()) else path


# --- limits: a cgroup per student (v2, or v1's memory and cpu controllers) ------------------------

def cgroup_version() -> int | None:
    """2 on a unified hierarchy, 1 where the v1 memory and cpu controllers are mounted, else None."""
    if (CGROUP / "cgroup.controllers").exists():
        return 2
    if (CGROUP / "memory").is_dir() and (CGROUP / "cpu").is_dir():
        return 1
    return None


def _own_v1(controller: str) -> str:
    """This process's cgroup in a v1 controller (a student's goes below it, inside any container)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, where = line.split(":", 2)
        if controller in controllers.split(","):
            return where.lstrip("/")
    return ""


def limit_folders(name: str) -> list[Path]:
    """The cgroup folders that hold student ``name``'s processes (one on v2, two on v1)."""
    version = cgroup_version()
    if version == 2:
        return [CGROUP / GROUP / name]
    if version == 1:
        return [CGROUP / c / _own_v1(c) / GROUP / name for c in ("memory", "cpu")]
    return []


def make_limits(name: str, memory_gb: float, cpus: float) -> list[Path]:
    """Make student ``name``'s cgroups with these limits (0: none) and return the ``cgroup.procs``
    files a process joins them by. Raises ``OSError`` where cgroups cannot be written."""
    memory = str(int(memory_gb * 2**30)) if memory_gb else None
    period = 100_000
    quota = int(cpus * period) if cpus else None
    version = cgroup_version()
    if version is None:
        raise OSError("no cgroup v2 hierarchy and no v1 memory and cpu controllers under /sys/fs/cgroup")
    procs = []
    if version == 2:
        group = CGROUP / GROUP
        group.mkdir(exist_ok=True)
        (CGROUP / "cgroup.subtree_control").write_text("+memory +cpu")
        (group / "cgroup.subtree_control").write_text("+memory +cpu")
        folder = group / name
        folder.mkdir(exist_ok=True)
        (folder / "memory.max").write_text(memory or "max")
        (folder / "memory.swap.max").write_text("0" if memory else "max")
        (folder / "cpu.max").write_text(f"{quota or 'max'} {period}")
        procs.append(folder / "cgroup.procs")
    else:
        mem_folder, cpu_folder = limit_folders(name)
        for folder in (mem_folder, cpu_folder):
            folder.mkdir(parents=True, exist_ok=True)
        (mem_folder / "memory.limit_in_bytes").write_text(memory or "-1")
        (cpu_folder / "cpu.cfs_period_us").write_text(str(period))
        (cpu_folder / "cpu.cfs_quota_us").write_text(str(quota or -1))
        procs += [mem_folder / "cgroup.procs", cpu_folder / "cgroup.procs"]
    return procs
