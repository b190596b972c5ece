#!/bin/sh
# The first step of `make lab` and `make test`, before anything is written: stops with one line
# that says exactly what to install when this machine cannot build the environment, and removes
# a .venv that an earlier failure left half-made (one without a working pip), so it is made afresh.
# Usage: sh tools/check-setup.sh PYTHON VENV
python=${1:?usage: check-setup.sh PYTHON VENV}
venv=${2:?usage: check-setup.sh PYTHON VENV}

fail() {
    echo "c2graph set-up: $*" >&2
    exit 1
}

# The install command this machine takes: apt-get as root, else with sudo; none without apt-get.
if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt="apt-get install -y"; else apt="sudo apt-get install -y"; fi
else
    apt=""
fi

system=$(uname -s)
machine=$(uname -m)
[ "$system" = Linux ] || fail "Triton publishes wheels for Linux only and this is $system: run the container or WSL (README, section 'macOS and Windows')"
case "$machine" in
    x86_64 | aarch64) ;;
    *) fail "torch and triton publish Linux wheels for x86_64 and aarch64 only and this machine is $machine" ;;
esac

if ! command -v "$python" >/dev/null 2>&1; then
    if [ -n "$apt" ] && [ "$python" = python3 ]; then
        fail "no python3 here: run '$apt python3 python3-venv', then run make again"
    fi
    fail "no $python here: install Python 3.11 or newer, or name one, e.g. 'make test PYTHON=python3.12'"
fi

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$python is Python $version and c2graph needs 3.11 or newer: install one and name it, e.g. 'make test PYTHON=python3.11'"

if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    if [ -n "$apt" ]; then
        fail "$python ($version) cannot create $venv without ensurepip, which Debian and Ubuntu ship apart: run '$apt python$version-venv', then run make again"
    fi
    fail "$python ($version) cannot create $venv: its ensurepip module is missing; install the package of your system that provides it, then run make again"
fi

if [ -e "$venv" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    [ -f "$venv/pyvenv.cfg" ] || fail "$venv exists and is no virtual environment: move it away, or name another, e.g. 'make test VENV=.venv-c2graph'"
    echo "c2graph set-up: $venv has no working pip (an earlier run stopped half-way): making it afresh"
    rm -rf "$venv"
fi
