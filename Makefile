# Two commands set everything up on a fresh machine: `make lab` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NBVAL  := --nbval --nbval-sanitize-with notebooks/sanitize.cfg
# A cell's time limit: Triton's interpreter on a CPU is slow, compiled kernels on a GPU are not.
CPU_NBVAL := $(NBVAL) --nbval-cell-timeout=300
# The stored notebook outputs are the CPU's: `make test` and `make notebooks` hide any GPU
# (the GPU is `make gpu-test`'s job), so they give the same results on every machine.
CPU    := CUDA_VISIBLE_DEVICES=

.PHONY: lab test unit nbval notebooks figures gpu-wheels gpu-deps gpu-test gpu-notebooks bench clean

# torch comes from PyTorch's CPU index: PyPI's torch for Linux is the CUDA build (gigabytes), which
# also requires a triton other than constraints.txt's. When that index does not answer within a few
# seconds, or with TORCH_INDEX= (empty), torch comes from pip's own index with the triton it requires
# (tools/install.sh says which route it took).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

# The library needs torch, Triton and numpy alone; the notebooks, the tests and the hub are extras
# (pyproject.toml). .venv gets the notebooks' (lab) and the tests' (dev): every target below uses it.
EXTRAS ?= lab,dev

# The check comes first: one line saying what to install, before anything is written.
$(STAMP): pyproject.toml constraints.txt
	@sh tools/check-setup.sh $(PYTHON) $(VENV)
	@sh tools/install.sh $(PYTHON) $(VENV) '$(TORCH_INDEX)' $(EXTRAS)
	@touch $(STAMP)

# JupyterLab's port (`make lab PORT=8890`); as root (a container) it must be told it may run so.
PORT ?= 8888
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
STUDENT ?= student

## make lab: create the environment if needed and open the notebooks in JupyterLab (self-study:
## the notebooks hold every exercise's solution)
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks --port $(PORT) $(AS_ROOT)

## make workshop: the student copies in student/ (made where missing, a student's edits never
## written over), opened in JupyterLab
.PHONY: workshop
workshop: $(STAMP)
	$(PY) -m c2graph.workshop.student --keep notebooks $(STUDENT)
	$(VENV)/bin/jupyter lab $(STUDENT) --port $(PORT) $(AS_ROOT)

## make test: unit tests, then every notebook under nbval (CPU)
test: $(STAMP)
	$(CPU) $(PY) -m pytest -q tests notebooks $(CPU_NBVAL)

unit: $(STAMP)
	$(CPU) $(PY) -m pytest -q tests

nbval: $(STAMP)
	$(CPU) $(PY) -m pytest -q notebooks $(CPU_NBVAL)

## make notebooks: re-execute every notebook in place, so the stored outputs stay current
notebooks: $(STAMP)
	$(CPU) $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb

## make figures: write the figures a reader needs outside Jupyter to figures/
figures: $(STAMP)
	$(PY) -m c2graph figures figures

## make student: student copies of every notebook in student/ (made afresh): every exercise's
## solution replaced by a stub that raises NotImplementedError, outputs cleared; it refuses, naming
## them, where student/ holds an edited copy or a file it did not make (`make workshop` keeps them)
.PHONY: student catch-up progress
student: $(STAMP)
	$(PY) -m c2graph.workshop.student notebooks $(STUDENT)

## make catch-up: for a student who did not do 02's puzzles 1 and 2 before the day: their solutions
## go into the copy of 02 in student/, in the puzzles' cells still as handed out (an edited one is kept)
CATCH_UP ?= 02:1,2
catch-up: $(STAMP)
	$(PY) -m c2graph.workshop.student --catch-up $(CATCH_UP) notebooks $(STUDENT)

## make progress: the pre-work as the saved copies in student/ show it: 00's set-up line and each
## check's last verdict
progress: $(STAMP)
	$(PY) -m c2graph.workshop.student --progress notebooks $(STUDENT)

## make browser-test: every notebook run in JupyterLab in a real browser (Debian's chromium, driven
## by Playwright) on the CPU; fails on an error output, a widget that does not render or a figure
## missing; one screenshot per notebook in figures/screens/
CHROMIUM ?= /usr/bin/chromium
.PHONY: browser-test
browser-test: $(STAMP)
	@if [ ! -x $(CHROMIUM) ]; then \
	  $(if $(filter 0,$(shell id -u)),,sudo) apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y chromium; fi
	$(CPU) nice $(PY) tests/browser/run_notebooks.py --browser $(CHROMIUM) --notebooks notebooks --screens figures/screens

# --- one hub for the room: JupyterHub on this machine, settings in hub/settings.toml ----------
# The hub and every student's JupyterLab run from their own environment, made with a python3 that
# every student's account can run (Debian's, where there is one; a python3 under root's home is not).
HUB_PYTHON ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,$(PYTHON))
HUB_VENV   ?= build/hub-venv
HUB_STAMP  := $(HUB_VENV)/.hub-installed
# JupyterHub's proxy: Debian's package (apt-get, as root or with sudo), else one line on what to do.
HUB_PROXY = command -v configurable-http-proxy >/dev/null || \
  if command -v apt-get >/dev/null; then { apt-get update -q && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q node-configurable-http-proxy; } || { \
    echo "c2graph hub: apt-get could not install node-configurable-http-proxy (JupyterHub's proxy; its \
error is above): check this machine's network and apt's sources, then run make again" >&2; exit 1; }; \
  else echo "c2graph hub: configurable-http-proxy (JupyterHub's proxy) is missing: run \
'npm install -g configurable-http-proxy', then run make again" >&2; exit 1; fi

# The hub's environment: c2graph with the notebooks' extra and JupyterHub, by the same install as
# .venv (so also where PyTorch's CPU index cannot be reached).
$(HUB_STAMP): pyproject.toml constraints.txt
	@sh tools/check-setup.sh $(HUB_PYTHON) $(HUB_VENV)
	@sh tools/install.sh $(HUB_PYTHON) $(HUB_VENV) '$(TORCH_INDEX)' lab,hub
	@touch $(HUB_STAMP)

HUB_RUN = C2GRAPH_VENV=$(abspath $(HUB_VENV)) $(HUB_VENV)/bin/python
# The hub makes Unix accounts and starts each student's JupyterLab as theirs: every hub target runs
# as root, and says so in one line before it installs anything.
.PHONY: hub-as-root
hub-as-root:
	@[ "$$(id -u)" = 0 ] || { echo "c2graph hub: make $(MAKECMDGOALS) runs as root (it makes one Unix account \
per student): run it as root, or as 'sudo make $(MAKECMDGOALS)'" >&2; exit 1; }

## make hub: JupyterHub for a room (as root): every account of hub/settings.toml gets a password
## made here (the instructor's and the students', printed once to a sheet), then the hub starts;
## each student signs in with a browser to their own JupyterLab on their own student copies
## (README, "One hub for the room")
.PHONY: hub hub-test hub-accounts hub-password hub-prework hub-catch-up hub-clean
hub: hub-as-root $(HUB_STAMP)
	@$(HUB_PROXY)
	@$(HUB_RUN) hub/accounts.py hand-out
	C2GRAPH_VENV=$(abspath $(HUB_VENV)) $(HUB_VENV)/bin/jupyterhub -f hub/jupyterhub_config.py

## make hub-accounts: the passwords of the accounts that have none yet, on a sheet to print (before
## the day; `make hub` does it too)
hub-accounts: hub-as-root $(HUB_STAMP)
	@$(HUB_RUN) hub/accounts.py hand-out

## make hub-password NAME=student07: a new password for one account (a lost slip), printed once;
## NAME=instructor SET=1 asks for one instead
hub-password: hub-as-root $(HUB_STAMP)
	@$(HUB_RUN) hub/accounts.py $(if $(SET),set,reset) $(NAME)

## make hub-prework: each student's pre-work, read from the copies in their home: 00's set-up line,
## and the verdict of each check they ran (01's exercises, 02's puzzles 1 and 2)
hub-prework: hub-as-root $(HUB_STAMP)
	@$(HUB_RUN) hub/prework.py

## make hub-catch-up STUDENTS="student07 student12": 02's puzzles 1 and 2 solved in those students'
## copies of 02 (cells still as handed out only), as each student
hub-catch-up: hub-as-root $(HUB_STAMP)
	@$(HUB_RUN) hub/prework.py --catch-up $(CATCH_UP) $(STUDENTS)

## make hub-clean: remove what make hub made: the Unix accounts it made (with their homes, so the
## students' work: copy it first), their cgroups, and the hub's state (database, passwords)
hub-clean: hub-as-root
	@$(HUB_PYTHON) hub/accounts.py clean

## make hub-test: the hub under load: HUB_STUDENTS students (default 8) sign in through its REST API,
## run HUB_NOTEBOOK in their own servers at once; each must finish with no error, reach no other
## student's files and fail to sign in as anyone else (as root; Unix accounts hubtest01... are made
## and always removed); results in out/hub-test.json
HUB_STUDENTS ?= 8
HUB_NOTEBOOK ?= 01_the_ratio2_compressor.ipynb
hub-test: hub-as-root $(HUB_STAMP)
	@$(HUB_PROXY)
	@mkdir -p out
	$(HUB_RUN) hub/load_test.py --students $(HUB_STUDENTS) --notebook notebooks/$(HUB_NOTEBOOK) --out out/hub-test.json

# --- on a CUDA host that already has torch and triton (no venv: its own python3) -------------
GPU_PY  ?= python3
OUT     ?= gpu-out
# Packages a GPU host may lack (gpu-wheels.txt) are installed here from .whl/, with no network.
GPU_SITE ?= /tmp/c2graph-gpu-site
GPU_ENV  = PYTHONPATH=$(CURDIR)/src:$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1
EXECUTE  = $(GPU_PY) -c 'import sys; from nbclient.cli import main; sys.exit(main())'

## make gpu-wheels: download what gpu-test needs beyond torch and triton into .whl/ (on a machine
## with network; carry .whl/ to a GPU host without one)
gpu-wheels:
	mkdir -p .whl
	grep -v '^#' gpu-wheels.txt | xargs $(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 -d .whl

gpu-deps:
	@if [ -d .whl ]; then $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
	  --upgrade --target $(GPU_SITE) .whl/*.whl; fi

## make gpu-test: every test against CUDA (GPU-marked ones included), then every notebook under
## nbval there: the same cells, compiled kernels and real CUDA graphs, the same stored outputs
gpu-test: gpu-deps
	@$(GPU_PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu-test needs a CUDA device")'
	@mkdir -p $(OUT)
	@failed=""; \
	$(GPU_ENV) $(GPU_PY) -m pytest -q -rs tests --junitxml=$(OUT)/gpu-tests.xml || failed=" tests"; \
	$(GPU_ENV) $(GPU_PY) -m pytest -q -p no:cacheprovider notebooks $(NBVAL) --nbval-cell-timeout=120 \
	  --junitxml=$(OUT)/gpu-notebooks.xml || failed="$$failed notebooks"; \
	if [ -n "$$failed" ]; then echo "gpu-test failed:$$failed"; exit 1; fi; echo "every test and every notebook passed on CUDA"

## make gpu-notebooks: execute every notebook on CUDA into $(OUT)/notebooks, to read its timings
gpu-notebooks: gpu-deps
	rm -rf $(OUT)/notebooks && mkdir -p $(OUT)/notebooks && cp notebooks/*.ipynb $(OUT)/notebooks/
	cd $(OUT)/notebooks && failed=""; for nb in *.ipynb; do \
	  echo "executing $$nb"; $(GPU_ENV) $(EXECUTE) --inplace --timeout=60 $$nb || failed="$$failed $$nb"; \
	done; if [ -n "$$failed" ]; then echo "notebooks that failed:$$failed"; exit 1; fi; echo "every notebook ran"

## make gpu-room: a room on one card without the hub: GPU_ROOM students (1, then 4, then 8) run
## notebooks 03 and 04 at once, each in their own kernel (compiled kernels, real CUDA graphs); every
## notebook must finish; times and the card's memory in $(OUT)/gpu-room.json
GPU_ROOM ?= 1,4,8
.PHONY: gpu-room
gpu-room: gpu-deps
	@mkdir -p $(OUT)
	$(GPU_ENV) $(GPU_PY) hub/gpu_room.py --students $(GPU_ROOM) --out $(OUT)/gpu-room.json

## make bench: the benchmark on a CUDA host (under 8 minutes on an H200): a table on stdout, the
## results in $(OUT)/benchmarks/results/<date>-<device>.json, to be copied to benchmarks/results/,
## then the fused kernel's program timeline beside them (benchmarks/timeline.py)
# BENCH_ARGS: more arguments, e.g. BENCH_ARGS="--time-budget-s 200 --rows 2048,16384"
bench:
	@mkdir -p $(OUT)/benchmarks/results
	$(GPU_ENV) $(GPU_PY) -m c2graph bench --folder $(OUT)/benchmarks/results $(BENCH_ARGS)
	$(GPU_ENV) $(GPU_PY) benchmarks/timeline.py --results $(OUT)/benchmarks/results

clean:
	rm -rf $(VENV) $(HUB_VENV) .pytest_cache .hypothesis
