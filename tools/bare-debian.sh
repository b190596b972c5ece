#!/bin/sh
# The README's set-up, followed literally in a bare Debian bookworm (debootstrap, minbase, chroot;
# apt's package lists emptied as in a fresh image): its Debian line as root, a clone of this
# repository, then `make test` up to the first tests (or all of it with --full). With
# --block-cpu-index, PyTorch's CPU index is made unreachable on purpose (/etc/hosts sends its name
# to 127.0.0.1, where nothing answers). With --hub, it follows the README's hub lines instead (as root:
# the clone to /srv/c2graph, then `make hub-accounts` in place of `make hub`, which would serve):
# the hub's environment installed by that route and every account's password made, then
# `make hub-test HUB_STUDENTS=2` (the hub running, two students signing in and running notebook 01,
# the sign-in attempts refused; /sys is bound in for the students' cgroups) and `make hub-clean`. The host's local certificate authorities
# (/usr/local/share/ca-certificates, e.g. a proxy's that inspects TLS) are carried in, and pip
# is told to trust the system's store (PIP_CERT), as a machine of that network would be set up. Needs root and debootstrap on a Debian or Ubuntu host.
# Usage: sudo sh tools/bare-debian.sh ROOTFS [--block-cpu-index] [--full | --hub]
set -eu
rootfs=${1:?usage: sh tools/bare-debian.sh ROOTFS [--block-cpu-index] [--full | --hub]}
shift
block=no
full=no
hub=no
for arg in "$@"; do
    case "$arg" in
        --block-cpu-index) block=yes ;;
        --full) full=yes ;;
        --hub) hub=yes ;;
        *) echo "bare-debian: unknown argument $arg" >&2; exit 2 ;;
    esac
done
repo=$(cd "$(dirname "$0")/.." && pwd)

[ -x "$rootfs/bin/sh" ] || debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian
rm -rf "$rootfs/var/lib/apt/lists/"* "$rootfs/root/c2graph" "$rootfs/srv/origin.git" "$rootfs/srv/c2graph"
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
mkdir -p "$rootfs/usr/local/share/ca-certificates"
cp -r /usr/local/share/ca-certificates/. "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
if [ "$block" = yes ]; then
    grep -q download.pytorch.org "$rootfs/etc/hosts" || echo "127.0.0.1 download.pytorch.org" >> "$rootfs/etc/hosts"
else
    sed -i '/download.pytorch.org/d' "$rootfs/etc/hosts"
fi
git clone -q --bare "$repo" "$rootfs/srv/origin.git"
git -C "$rootfs/srv/origin.git" symbolic-ref HEAD "refs/heads/$(git -C "$repo" rev-parse --abbrev-ref HEAD)"
mountpoint -q "$rootfs/proc" || mount -t proc proc "$rootfs/proc"
trap 'umount "$rootfs/proc"' EXIT

# The README's lines, as root in a bare image with no package lists, no git and no sudo.
line=$(sed -n '/install first:/,/^```$/p' "$repo/README.md" | grep '^S=')
echo "bare-debian: running the README's line: $line"
until_tests='make test 2>&1 | while IFS= read -r l; do echo "$l"; case "$l" in *"passed"*|*"%]"*) break;; esac; done'
[ "$full" = yes ] && until_tests="make test"
certs=
[ -n "$(ls /usr/local/share/ca-certificates 2>/dev/null)" ] && certs=PIP_CERT=/etc/ssl/certs/ca-certificates.crt
if [ "$hub" = yes ]; then
    # the hub's block of the README, with the clone's REPO set to this repository and make hub-accounts
    # (the install and the passwords, the part of make hub before it serves) in place of make hub
    lines=$(sed -n '/^## One hub for the room/,/^## /p' "$repo/README.md" | sed -n '/^```bash$/,/^```$/p' | grep -v '^```' \
        | sed -e 's|^REPO=.*|REPO=/srv/origin.git|' -e 's|\$S make hub |$S make hub-accounts |')
    echo "bare-debian: running the README's hub lines:"; echo "$lines"
    mountpoint -q "$rootfs/sys" || mount --rbind /sys "$rootfs/sys"
    trap 'umount "$rootfs/proc"; umount -R "$rootfs/sys"' EXIT
    chroot "$rootfs" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb $certs sh -c "
set -e
cd /root
$line
update-ca-certificates >/dev/null
started=\$(date +%s)
$lines
echo \"bare-debian: make hub-accounts installed the hub and made the passwords in \$((\$(date +%s) - started)) s\"
build/hub-venv/bin/python -c 'import c2graph, torch, triton, jupyterhub; print(\"bare-debian: hub environment: torch\", torch.__version__, \"triton\", triton.__version__, \"jupyterhub\", jupyterhub.__version__)'
\$S make hub-test HUB_STUDENTS=2
make hub-clean
"
    exit 0
fi
chroot "$rootfs" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb $certs sh -c "
set -e
cd /root
$line
update-ca-certificates >/dev/null
git clone -q /srv/origin.git c2graph && cd c2graph
started=\$(date +%s)
sh -c '$until_tests'
echo \"bare-debian: make test reached its tests in \$((\$(date +%s) - started)) s\"
.venv/bin/python -c 'import torch, triton; print(\"bare-debian: torch\", torch.__version__, \"triton\", triton.__version__)'
"
