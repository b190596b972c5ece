"""JupyterHub for a workshop room on one machine: `make hub` (as root) runs
`jupyterhub -f hub/jupyterhub_config.py` with the repository's `.venv`.

Everything an instructor sets is in hub/settings.toml (or the file C2GRAPH_HUB_SETTINGS names).
Every account of the settings, the instructors' included, signs in with the password the organiser
handed out (made by `make hub` before the hub opens; hub/auth.py's WorkshopAuthenticator): no
password is set by signing in, and the hub does not start while an account has none. The hub starts their JupyterLab as their own Unix user, on their own
student copies in ~/c2graph (made where missing, never written over), inside cgroups that hold
their memory and CPU limits, with the GPU the settings give them (WorkshopSpawner). The hub stops
with one line that says what to do when this machine cannot run it.
"""

import asyncio
import os
import pwd
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import room  # noqa: E402  (hub/room.py, beside this file)
from auth import WorkshopAuthenticator  # noqa: E402  (hub/auth.py)
from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid  # noqa: E402

c = get_config()  # noqa: F821  (JupyterHub's config loader defines it)


def stop(line: str) -> None:
    print(f"c2graph hub: {line}", file=sys.stderr)
    sys.exit(1)


try:
    settings = room.load(Path(os.environ.get("C2GRAPH_HUB_SETTINGS", room.SETTINGS)))
except room.SettingsError as e:
    stop(f"{e}: fix it and run make hub again")
venv = Path(os.environ.get("C2GRAPH_VENV", room.REPOSITORY / "build" / "hub-venv"))
singleuser = venv / "bin" / "jupyterhub-singleuser"
COPIES = room.REPOSITORY / "src" / "c2graph" / "workshop" / "student.py"
SERVER_PORTS = 20000
"""Student k's JupyterLab listens on 127.0.0.1, port SERVER_PORTS + k."""

if os.geteuid() != 0:
    stop("the hub runs as root: it makes one Unix account per student and starts each student's JupyterLab "
         "as that account; run 'sudo make hub'")
if not singleuser.exists():
    stop(f"{singleuser} is missing: run make hub, which installs JupyterHub into {venv}")
for needed in (singleuser, venv / "bin" / "python", room.REPOSITORY / "notebooks"):
    closed = room.readable_by_everyone(needed)
    if closed is not None:
        stop(f"the students' accounts cannot enter {closed}, so they cannot run {needed}: put the repository, and "
             f"the python3 that {venv} was made with, where every user can read them (e.g. the repository under "
             "/srv, and 'make clean hub HUB_PYTHON=/usr/bin/python3')")
if os.path.isdir("/usr/share/nodejs"):  # Debian's node modules, for a node that is not Debian's own
    os.environ["NODE_PATH"] = os.pathsep.join(filter(None, ["/usr/share/nodejs", os.environ.get("NODE_PATH")]))
if shutil.which("configurable-http-proxy") is None:
    stop("configurable-http-proxy (JupyterHub's proxy) is missing: 'apt-get install node-configurable-http-proxy' "
         "(Debian, Ubuntu) or 'npm install -g configurable-http-proxy', then run make hub again")

accounts = settings.accounts
settings.state.mkdir(parents=True, exist_ok=True)
settings.state.chmod(0o700)
credentials_file = settings.state / room.PASSWORDS
without = [a for a in accounts if a not in room.Credentials(credentials_file, settings.min_password_length).names()]
if without:
    stop(f"{len(without)} accounts have no password yet ({', '.join(without[:3])}{', ...' if len(without) > 3 else ''}): "
         "run make hub, which makes them and prints them once on a sheet before the hub opens")
for name in accounts:
    room.ensure_account(name, settings.state / room.MADE_ACCOUNTS)
limited = bool(settings.memory_gb or settings.cpus)
if limited:
    try:
        room.make_limits(accounts[0], settings.memory_gb, settings.cpus)
    except OSError as e:
        stop(f"per-student limits need cgroups that root can write ({e}); on this machine set [limits] memory_gb = 0 "
             "and cpus = 0 in the settings to run without limits, knowing that one student can then take every "
             "core and all the memory")


class WorkshopSpawner(LocalProcessSpawner):
    """The student's JupyterLab as their Unix user, on ~/c2graph, inside their cgroups, with their GPU."""

    joins: list = []

    def get_env(self):
        env = super().get_env()
        env["CUDA_VISIBLE_DEVICES"] = settings.gpu_of(self.user.name)
        return env

    def make_preexec_fn(self, name):
        drop_to_the_student = super().make_preexec_fn(name)
        joins = [str(p) for p in self.joins]

        def preexec():  # in the child, as root: join the cgroups, then become the student
            for procs in joins:
                fd = os.open(procs, os.O_WRONLY)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
            drop_to_the_student()

        return preexec

    async def start(self):
        home = pwd.getpwnam(self.user.name).pw_dir
        # as the student, without blocking the hub; student.py run as a file imports nbformat alone
        # (not torch, as `python -m c2graph...` would), so a room's sign-ins do not queue behind it
        made = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "python"), str(COPIES), "--keep", str(room.REPOSITORY / "notebooks"),
            os.path.join(home, "c2graph"), preexec_fn=set_user_setuid(self.user.name), env=self.get_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await made.communicate()
        if made.returncode != 0:
            raise RuntimeError(f"the student copies of {self.user.name} could not be made: {err.decode().strip()}")
        self.log.info("%s: %s", self.user.name, out.decode().strip())
        self.joins = room.make_limits(self.user.name, settings.memory_gb, settings.cpus) if limited else []
        # a port of the account's own, below Linux's ephemeral range: a random free port could be
        # taken by another student's kernel before this server binds it (seen with 16 at once)
        self.port = SERVER_PORTS + accounts.index(self.user.name)
        return await super().start()


c.JupyterHub.ip = settings.ip
c.JupyterHub.port = settings.port
c.JupyterHub.db_url = f"sqlite:///{settings.state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(settings.state / "cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(settings.state / "proxy.pid")
c.JupyterHub.authenticator_class = WorkshopAuthenticator
c.WorkshopAuthenticator.accounts = list(accounts)
c.WorkshopAuthenticator.credentials_file = str(credentials_file)
c.WorkshopAuthenticator.min_password_length = settings.min_password_length
c.Authenticator.allowed_users = set(accounts)
c.Authenticator.admin_users = set(settings.admins)
c.JupyterHub.spawner_class = WorkshopSpawner
c.Spawner.cmd = [str(singleuser)]
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab/tree/c2graph"
# A room signs in at once: give a loaded machine time to start every server (20 students on two
# cores took up to 261 s, hub/results/).
c.Spawner.start_timeout = 600
c.Spawner.http_timeout = 600
c.JupyterHub.concurrent_spawn_limit = 0
