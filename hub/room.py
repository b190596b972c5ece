"""The workshop hub's pieces that need no JupyterHub: its settings, the accounts and the passwords
the organiser hands out, the GPU each student is given, and the cgroups that hold each student's limits.

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
import time
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


MADE_ACCOUNTS = "accounts-made"
"""The file of the state folder that lists the Unix accounts the hub made (``make hub-clean`` removes
those, and no other)."""
PASSWORDS = "passwords.json"
"""The file of the state folder that holds the passwords' hashes (:class:`Credentials`)."""


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

    @property
    def accounts(self) -> tuple[str, ...]:
        """Every account of the room: the students in order, then the admins who are not students."""
        return self.students + tuple(a for a in self.admins if a not in self.students)

    def gpu_of(self, name: str) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` of account ``name``: one device of :attr:`gpus`, round robin
        over the students in order (admins after them); ``""`` (no GPU) when :attr:`gpus` is empty."""
        if not self.gpus:
            return ""
        return str(self.gpus[self.accounts.index(name) % len(self.gpus)])


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


# --- credentials: handed out by the organiser, kept as salted scrypt hashes ---------------------------

ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
"""The letters and digits of a password handed out: none that reads as another (no i, l, o, 0, 1)."""


class SignInRefused(ValueError):
    """Why a sign-in was refused, in words the person at the keyboard can act on."""


class Credentials:
    """``name -> salted scrypt hash`` of each account's password, in a JSON file only root reads
    (mode 600). The organiser makes them (:meth:`hand_out`, :meth:`set`); signing in only checks them:
    nobody sets a password by signing in."""

    def __init__(self, path: Path, min_length: int):
        self.path, self.min_length = Path(path), min_length

    def _read(self) -> dict[str, str]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _write(self, stored: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.touch(0o600)
        temporary.chmod(0o600)
        temporary.write_text(json.dumps(stored, indent=1))
        temporary.replace(self.path)

    @staticmethod
    def _hash(password: str, salt: bytes) -> str:
        return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1).hex()

    def names(self) -> set[str]:
        """The accounts that have a password."""
        return set(self._read())

    def set(self, name: str, password: str) -> None:
        """Give ``name`` this password (the organiser's choice); ``ValueError`` when it is too short."""
        if len(password) < self.min_length:
            raise ValueError(f"password: {len(password)} characters, expected {self.min_length} or more")
        stored = self._read()
        salt = secrets.token_bytes(16)
        stored[name] = f"{salt.hex()}:{self._hash(password, salt)}"
        self._write(stored)

    def hand_out(self, names, renew: bool = False) -> dict[str, str]:
        """A new random password for each of ``names`` that has none (every one with ``renew``), stored
        hashed; returns them (``name -> password``), the only time they are seen in clear."""
        have = self._read()
        length = max(12, self.min_length)
        made = {name: "-".join("".join(secrets.choice(ALPHABET) for _ in range(4)) for _ in range(-(-length // 4)))
                for name in names if renew or name not in have}
        for name, password in made.items():
            self.set(name, password)
        return made

    def check(self, name: str, password: str) -> bool:
        """True when ``password`` is ``name``'s; False otherwise, and always for an account without one."""
        stored = self._read()
        if name not in stored:
            return False
        salt, digest = stored[name].split(":")
        return hmac.compare_digest(self._hash(password, bytes.fromhex(salt)), digest)

    def sign_in(self, accounts, name: str, password: str) -> str:
        """``name`` when it is one of ``accounts`` and ``password`` is its own; else :class:`SignInRefused`
        saying why: a name not on the list, an account without a password yet, a password shorter
        than any handed out, or a wrong one."""
        if name not in accounts:
            raise SignInRefused(f"{name!r} is not an account of this room: use the name on your slip "
                                "(e.g. student07), or ask the instructor")
        if name not in self.names():
            raise SignInRefused(f"{name} has no password yet: ask the instructor")
        if len(password) < self.min_length:
            raise SignInRefused(f"that password is {len(password)} characters, and every password here is "
                                f"{self.min_length} or more: type the one on your slip, or ask the instructor")
        if not self.check(name, password):
            raise SignInRefused(f"that is not the password of {name}: type the one on your slip, or ask the instructor")
        return name


def sheet(made: dict[str, str], hub: str) -> str:
    """The slips to print and cut, one per account: where to sign in, the name and the password."""
    cut = "-" * 60
    return "".join(f"{cut}\nc2graph workshop: open {hub} in a browser and sign in with\n"
                   f"    name:      {name}\n    password:  {password}\n" for name, password in made.items()) + cut + "\n"


# --- accounts: one Unix user per student, a home only they can read ------------------------------

def ensure_account(name: str, made_file: Path | None = None) -> pwd.struct_passwd:
    """The Unix account ``name``, made (with a home of mode 700) when it does not exist; an account
    made here is added to ``made_file`` (one name a line), so that ``make hub-clean`` removes it and
    no account it did not make."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name], check=True)
        account = pwd.getpwnam(name)
        if made_file is not None:
            made_file.parent.mkdir(parents=True, exist_ok=True)
            with open(made_file, "a") as f:
                f.write(name + "\n")
    os.chmod(account.pw_dir, 0o700)
    return account


def processes_of(uid: int) -> list[int]:
    """The ids of the processes that run as ``uid`` (read from /proc: no procps needed)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:  # it ended while we looked
                continue
            real = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
            if int(real) == uid:
                found.append(int(entry.name))
    return found


def remove_account(name: str) -> None:
    """End every process of ``name``, remove the account with its home and its cgroups; what is
    already gone is skipped."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        uid = None
    if uid is not None:
        for _ in range(5):
            left = processes_of(uid)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
    for folder in limit_folders(name):
        if folder.exists():
            try:
                folder.rmdir()
            except OSError:  # a process that outlived the kill still holds it; the next clean removes it
                pass
    for folder in {f.parent for f in limit_folders(name)}:  # the group, once no student is left in it
        if folder.exists() and not any(p.is_dir() for p in folder.iterdir()):
            folder.rmdir()


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
