#!/bin/sh
# The second step of `make lab`, `make test` and `make hub`, after check-setup.sh: creates VENV and
# installs c2graph with the extras EXTRAS (default lab,dev; the hub's: lab,hub) and the versions
# constraints.txt pins. Every failure ends with one line that says what to do.
#
# torch comes from PyTorch's CPU index when that index answers within a few seconds: PyPI's torch
# for Linux is the CUDA build (gigabytes of CUDA libraries, and it requires a triton of its own).
# When the index does not answer (or TORCH_INDEX is empty), torch comes from pip's own index, and
# triton is the one that torch requires: constraints.txt's triton pin is left out for that route.
# Usage: sh tools/install.sh PYTHON VENV TORCH_INDEX [EXTRAS]
python=${1:?usage: install.sh PYTHON VENV TORCH_INDEX [EXTRAS]}
venv=${2:?usage: install.sh PYTHON VENV TORCH_INDEX [EXTRAS]}
index=${3-}
extras=${4:-lab,dev}
py=$venv/bin/python
PROBE_S=5

say() {
    echo "c2graph set-up: $*"
}

fail() {
    echo "c2graph set-up: $*" >&2
    exit 1
}

network="check this machine's network (and pip's proxy or certificates, if it needs them: 'pip config list'), then run make again"

"$python" -m venv "$venv" || fail "'$python -m venv $venv' failed (its error is above): remove $venv and run make again"
"$py" -m pip install --quiet --upgrade pip \
    || fail "pip could not reach its index to update itself (its error is above): $network"

# Does PyTorch's CPU index answer? One request, PROBE_S seconds at most (pip would retry every
# package five times before giving up).
reachable() {
    "$py" - "$1" "$PROBE_S" <<'EOF' 2>&1
import sys, urllib.request
url, seconds = sys.argv[1].rstrip("/") + "/torch/", float(sys.argv[2])
try:
    urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=seconds).close()
except Exception as e:  # any failure means: take the other route
    print(str(getattr(e, "reason", e)).strip() or type(e).__name__)
    sys.exit(1)
EOF
}

constraints=constraints.txt
if [ -n "$index" ] && why=$(reachable "$index"); then
    say "torch from PyTorch's CPU index ($index)"
    "$py" -m pip install --quiet -c constraints.txt --index-url "$index" torch \
        || fail "pip could not install torch from $index (its error is above): $network; or take torch from pip's own index with TORCH_INDEX= (empty), e.g. 'make test TORCH_INDEX='"
else
    if [ -n "$index" ]; then
        say "PyTorch's CPU index ($index) did not answer within ${PROBE_S} s ($why): torch from pip's own index, with the triton it requires"
    else
        say "torch from pip's own index (TORCH_INDEX is empty), with the triton it requires"
    fi
    # constraints.txt without its triton pin: PyPI's torch for Linux requires a triton of its own
    constraints=$venv/constraints-pip-index.txt
    grep -v '^triton==' constraints.txt > "$constraints"
    "$py" -m pip install --quiet -c "$constraints" torch \
        || fail "pip could not install torch from its own index (its error is above): $network"
    # a torch that requires no triton (a CPU build) leaves triton to constraints.txt's pin
    "$py" -c 'from importlib.metadata import version; version("triton")' 2>/dev/null || constraints=constraints.txt
fi

"$py" -m pip install --quiet -c "$constraints" -e ".[$extras]" \
    || fail "pip could not install c2graph's other packages (its error is above): $network"
"$py" - <<'EOF'
from importlib.metadata import version
print(f"c2graph set-up: installed torch {version('torch')}, triton {version('triton')}")
EOF
