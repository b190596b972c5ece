"""The room's accounts, as the organiser (root) keeps them: `make hub-accounts`, `make hub-password`
and `make hub-clean` run this with hub/settings.toml (or the file C2GRAPH_HUB_SETTINGS names).

    python hub/accounts.py hand-out       # a password for every account without one; the new ones on a sheet
    python hub/accounts.py reset NAME...  # a new password for these accounts (a lost slip), printed once
    python hub/accounts.py set NAME       # asks for the password of NAME (e.g. the instructor's own)
    python hub/accounts.py clean          # removes the Unix accounts the hub made, their cgroups, the state

Each failure is one line that says what to do.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import room  # noqa: E402  (hub/room.py, beside this file)


def fail(line: str) -> int:
    print(f"c2graph hub: {line}", file=sys.stderr)
    return 1


def hub_address(settings: room.Settings) -> str:
    host = settings.ip or socket.getfqdn()
    return f"http://{host}:{settings.port}"


def print_sheet(settings: room.Settings, made: dict[str, str]) -> None:
    """Write the slips of ``made`` to a new sheet in the state folder (root only) and print them."""
    text = room.sheet(made, hub_address(settings))
    path = settings.state / f"sheet-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    path.touch(0o600)
    path.write_text(text)
    print(text, end="")
    print(f"c2graph hub: {len(made)} new passwords, on the slips above and in {path} (root only): print it, "
          "hand each slip to its owner, then delete the file")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("hand-out", "reset", "set", "clean") or (argv[0] in ("reset", "set") and len(argv) < 2):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        return fail("the room's accounts are root's: run it as root, or with sudo")
    try:
        settings = room.load(Path(os.environ.get("C2GRAPH_HUB_SETTINGS", room.SETTINGS)))
    except room.SettingsError as e:
        return fail(f"{e}: fix it and run make again")
    command, names = argv[0], argv[1:]
    credentials = room.Credentials(settings.state / room.PASSWORDS, settings.min_password_length)
    unknown = [n for n in names if n not in settings.accounts]
    if unknown:
        return fail(f"{', '.join(unknown)}: not an account of {room.SETTINGS.name} (its accounts: "
                    f"{settings.accounts[0]} to {settings.accounts[-1]}); add it there first")
    if command != "clean":
        settings.state.mkdir(parents=True, exist_ok=True)
        settings.state.chmod(0o700)
    if command == "hand-out":
        made = credentials.hand_out(settings.accounts)
        if made:
            print_sheet(settings, made)
        else:
            print(f"c2graph hub: every one of the {len(settings.accounts)} accounts has its password already "
                  "(make hub-password NAME=... makes a new one)")
    elif command == "reset":
        print_sheet(settings, credentials.hand_out(names, renew=True))
    elif command == "set":
        (name,) = names
        first = getpass.getpass(f"password for {name} (at least {settings.min_password_length} characters): ")
        if getpass.getpass("the same again: ") != first:
            return fail("the two passwords differ: nothing was changed; run it again")
        try:
            credentials.set(name, first)
        except ValueError as e:
            return fail(f"{e}: nothing was changed; run it again")
        print(f"c2graph hub: {name}'s password is set")
    else:
        made_file = settings.state / room.MADE_ACCOUNTS
        made = made_file.read_text().split() if made_file.exists() else []
        for name in dict.fromkeys(made):
            room.remove_account(name)
        shutil.rmtree(settings.state, ignore_errors=True)
        print(f"c2graph hub: removed the {len(set(made))} Unix accounts the hub made (with their homes), their "
              f"cgroups and {settings.state}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
