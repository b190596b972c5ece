"""The hub's sign-in: JupyterHub's authenticator over the passwords the organiser handed out
(:class:`room.Credentials`). Importing it changes nothing; ``hub/jupyterhub_config.py`` configures
it, and ``tests/test_hub.py`` runs it as the hub does, without a hub."""

from __future__ import annotations

import sys
from pathlib import Path

from jupyterhub.auth import Authenticator
from tornado import web
from traitlets import Integer, List, Unicode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import room  # noqa: E402  (hub/room.py, beside this file)


class WorkshopAuthenticator(Authenticator):
    """An account of the settings signs in with the password the organiser handed out, and nothing
    else; a refusal says why on the login page (JupyterHub shows an ``HTTPError``'s message there)."""

    accounts = List(Unicode(), help="Every account of the room: the students, then the instructors.").tag(config=True)
    credentials_file = Unicode(help="The passwords' hashes (room.Credentials' file).").tag(config=True)
    min_password_length = Integer(8, help="The shortest password the organiser may set.").tag(config=True)

    async def authenticate(self, handler, data):
        credentials = room.Credentials(Path(self.credentials_file), self.min_password_length)
        name = self.normalize_username(data.get("username", ""))
        try:
            return credentials.sign_in(self.accounts, name, data.get("password", ""))
        except room.SignInRefused as refused:
            self.log.warning("sign-in refused: %s", refused)
            raise web.HTTPError(403, "%s", str(refused)) from None
