# The README's two commands: `make demo` (the full six-phase migration on the embedded local
# default) and `make test`. Both install what they need into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-train test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/runbook run params/demo.yaml

demo-train: $(STAMP)
	$(VENV)/bin/runbook run params/demo-train.yaml

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run_phases.py params/demo.yaml

clean:
	rm -rf .runbook reports/*/ $(VENV)
