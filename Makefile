# Two commands set everything up on a fresh machine: `make lab` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NBVAL  := --nbval --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout=300

.PHONY: lab test unit nbval notebooks figures gpu-test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

## make lab: create the environment if needed and open the notebooks in JupyterLab
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks

## make test: unit tests, then every notebook under nbval (CPU)
test: $(STAMP)
	$(PY) -m pytest -q tests notebooks $(NBVAL)

unit: $(STAMP)
	$(PY) -m pytest -q tests

nbval: $(STAMP)
	$(PY) -m pytest -q notebooks $(NBVAL)

## make notebooks: re-execute every notebook in place, so the stored outputs stay current
notebooks: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb

## make figures: write the figures a reader needs outside Jupyter to figures/
figures: $(STAMP)
	$(PY) -m c2graph.figures figures

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
