# The README's two commands: `make demo` (the full six-phase migration on the embedded local
# default) and `make test`. Both install what they need into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The official Vast.ai and Runpod clients, each in its own environment (vastai 1.9.1 pins
# cryptography==49.0.0, runpod 1.12.0 needs >=50), for the tests that drive the simulators with them.
VASTAI_STAMP := .venv-vastai/.installed
RUNPOD_STAMP := .venv-runpod/.installed
# The chat server `make demo-service` migrates, in its own environment (the service's "image": no
# runbook code in it): transformers' own OpenAI-compatible server, on the CPU build of torch.
SERVE_STAMP := .venv-serve/.installed
# The docs site's builder (mkdocs with mkdocs-material), in its own environment.
DOCS_STAMP := .venv-docs/.installed
# Airflow (apache-airflow-core with the standard provider's human-in-the-loop operators) and the
# runbook's DAGs (integrations/airflow), in their own environment: they call the project's
# `runbook`, and the main environment never imports Airflow.
AIRFLOW_STAMP := .venv-airflow/.installed
CHAT_MODELS := .runbook/models

.PHONY: docs demo demo-fleet demo-shootout demo-train demo-train-ddp demo-checkpoint demo-s3 demo-service demo-service-router demo-service-models demo-runpod-handler rehearse test test-e2e test-e2e-parallel test-e2e-measure e2e-setup \
	browser haproxy bench bench-streaming soak clean lab strip-filter lock

# Every environment installs exact versions from its lock (locks/*.txt, `make lock` writes them
# again), so two fresh clones compute verdicts with the same libraries; then this package itself,
# editable, without resolving anything more, and `pip check` confirms the set is consistent.
PIP := --quiet --disable-pip-version-check
$(STAMP): pyproject.toml locks/main.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP) -r locks/main.txt
	$(PY) -m pip install $(PIP) --no-deps -e '.[test]'
	$(PY) -m pip uninstall $(PIP) -y lark rfc3987-syntax 2>/dev/null  # LOCK_OMIT, from an older lock
	$(PY) -m pip check >/dev/null
	@$(MAKE) --no-print-directory strip-filter
	touch $(STAMP)

# In a git checkout, notebooks are staged without outputs (nbstripout as a git clean filter, cell
# ids kept; .gitattributes names the notebooks): running and saving one in JupyterLab never puts
# outputs into a commit, and `git diff` shows code changes only.
strip-filter:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git config filter.nbstripout.clean '"$(CURDIR)/$(PY)" -m nbstripout --keep-id' && \
		git config filter.nbstripout.smudge cat && \
		git config filter.nbstripout.required true && \
		git config diff.ipynb.textconv '"$(CURDIR)/$(PY)" -m nbstripout --keep-id -t'; fi

# A demo that ends NO-GO (exit 1) or HOLD (exit 3) reached a decision: make reports it as done, not
# as a crash (`runbook run` says the exit codes on its last line; scripts call it for them). A
# failed run (4) or a usage error (2) fails make.
DECIDED := rc=$$?; [ $$rc = 1 ] || [ $$rc = 3 ] || exit $$rc
demo: $(STAMP)
	@$(VENV)/bin/runbook run params/demo.yaml || { $(DECIDED); }

demo-train: $(STAMP)
	@$(VENV)/bin/runbook run params/demo-train.yaml || { $(DECIDED); }

demo-train-ddp: $(STAMP)
	@$(VENV)/bin/runbook run params/demo-train-ddp.yaml || { $(DECIDED); }

# Several candidate targets raced in one run (params/demo-shootout.yaml): a slow one, a pricey
# one and the best; phase 04 eliminates the first two and goes on with the pick.
demo-shootout: $(STAMP)
	@$(VENV)/bin/runbook run params/demo-shootout.yaml || { $(DECIDED); }

# Bring your own checkpoint: examples/checkpoint-demo (shards, index, trainer state), no user code.
demo-checkpoint: $(STAMP)
	@$(VENV)/bin/runbook run params/demo-checkpoint.yaml || { $(DECIDED); }

# The whole demo against a loopback S3 endpoint (moto's server; any credentials are accepted).
demo-s3: $(STAMP)
	$(VENV)/bin/moto_server -H 127.0.0.1 -p 5000 >/dev/null 2>&1 & pid=$$!; sleep 2; \
	AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo $(VENV)/bin/runbook run params/demo-s3.yaml; rc=$$?; \
	kill $$pid; [ $$rc = 0 ] || [ $$rc = 1 ] || [ $$rc = 3 ] || exit $$rc

# A fleet on Airflow (docs/how-to/airflow.md): the fleet DAG over params/fleet (three local
# checkpoint migrations, at most two in flight) run by Airflow's in-process runner, dag.test(), the
# runs kept in a loopback S3 bucket; one is approved through Airflow's human-in-the-loop request,
# one ends NO-GO and fails the DAG run. It prints each decision and verifies every stored run.
demo-fleet: $(STAMP) $(AIRFLOW_STAMP)
	@.venv-airflow/bin/python integrations/airflow/demo_fleet.py

# A team's own service migrated unchanged and judged over its own API: `transformers serve` (an
# OpenAI-compatible chat server) between two local profiles; the models are built here, never
# downloaded. DEMO_SERVICE_PARAMS=params/demo-service-reseeded.yaml serves the target from a
# re-seeded model, which must end NO-GO on parity.
DEMO_SERVICE_PARAMS ?= params/demo-service.yaml
demo-service: $(STAMP) demo-service-models
	@$(VENV)/bin/runbook run $(DEMO_SERVICE_PARAMS) || { $(DECIDED); }

# The chat service's cutover through a real router (params/demo-service-router.yaml): Debian's
# HAProxy in front of both service pods, at least 1,000 of the service's own streamed requests
# replayed through it while the weights move (`make haproxy` installs it, as root).
demo-service-router: $(STAMP) demo-service-models haproxy
	@$(VENV)/bin/runbook run params/demo-service-router.yaml || { $(DECIDED); }

# A team's Runpod Serverless handler migrated unchanged: the official runpod SDK's local API serves
# it from its own environment (.venv-runpod); stream and readiness at the protocol's defaults.
demo-runpod-handler: $(STAMP) $(RUNPOD_STAMP)
	@$(VENV)/bin/runbook run params/demo-runpod-handler.yaml || { $(DECIDED); }

demo-service-models: $(STAMP) $(SERVE_STAMP)
	$(PY) examples/make_chat_model.py $(CHAT_MODELS)/chat-seed0 --seed 0
	$(PY) examples/make_chat_model.py $(CHAT_MODELS)/chat-seed1 --seed 1

$(SERVE_STAMP): locks/serve.txt
	$(PYTHON) -m venv .venv-serve
	.venv-serve/bin/python -m pip install $(PIP) -r locks/serve.txt
	touch $(SERVE_STAMP)

# A real Runpod-to-Vast.ai migration rehearsed offline: loopback simulators of both APIs and of S3,
# all six phases through the real adapters, evidence marked as a rehearsal.
# The service rehearsals' simulated machines run the chat server's stand-in (.venv-serve, the models)
# and the Runpod handler's (.venv-runpod: the official SDK serving examples/runpod_handler.py).
rehearse: $(STAMP) demo-service-models $(RUNPOD_STAMP)
	$(VENV)/bin/runbook rehearse params/runpod-to-vast.yaml params/runpod-to-vast-train.yaml \
		params/runpod-to-vast-service.yaml params/runpod-serverless-to-vast-handler.yaml

# Lint, types, the unit and contract tests, and one whole migration through every phase
# (under 5 minutes on 2 cores). The other end-to-end cases are `make test-e2e`.
test: $(STAMP) docs
	$(VENV)/bin/ruff check runbook_lib tests benchmarks scripts integrations
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -m "not e2e or smoke" -n 3 --dist worksteal

# The docs site (mkdocs.yml; docs/ is its source): the generated reference pages checked against the
# code, then a strict build (a warning, a broken link or a page missing from the nav fails it).
# `make test` runs it; the site is written to site/ (not committed).
docs: $(STAMP) $(DOCS_STAMP)
	$(PY) scripts/docs_reference.py --check
	@out=$$(NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict --site-dir site 2>&1) || \
		{ echo "$$out"; echo "make docs: the site did not build (warnings are errors)"; exit 1; }
	@echo "docs: site/index.html built with no warning"

$(DOCS_STAMP): locks/docs.txt
	$(PYTHON) -m venv .venv-docs
	.venv-docs/bin/python -m pip install $(PIP) -r locks/docs.txt
	touch $(DOCS_STAMP)

$(VASTAI_STAMP): locks/vastai.txt
	$(PYTHON) -m venv .venv-vastai
	.venv-vastai/bin/python -m pip install $(PIP) -r locks/vastai.txt
	touch $(VASTAI_STAMP)

$(AIRFLOW_STAMP): locks/airflow.txt integrations/airflow/pyproject.toml
	$(PYTHON) -m venv .venv-airflow
	.venv-airflow/bin/python -m pip install $(PIP) -r locks/airflow.txt
	.venv-airflow/bin/python -m pip install $(PIP) --no-deps -e integrations/airflow
	touch $(AIRFLOW_STAMP)

$(RUNPOD_STAMP): locks/runpod.txt
	$(PYTHON) -m venv .venv-runpod
	.venv-runpod/bin/python -m pip install $(PIP) -r locks/runpod.txt
	touch $(RUNPOD_STAMP)

# Resolve every environment afresh from its top-level requirements and write its lock (torch by
# version: its local CPU wheel's hash is not the registry's). Review the diff before committing.
LOCK_TMP ?= /tmp/runbook-lock
LOCK_TOPS_runpod := 'runpod==1.12.0'
LOCK_TOPS_vastai := 'vastai==1.9.1'
LOCK_TOPS_serve := 'torch==2.13.0' 'transformers[serving]==5.24.0'
LOCK_TOPS_docs := 'mkdocs==1.6.1' 'mkdocs-material==9.8.2'
LOCK_TOPS_airflow := 'apache-airflow-core==3.3.2' 'apache-airflow-providers-standard==1.21.0'
lock:
	rm -rf $(LOCK_TMP)
	$(PYTHON) -m venv $(LOCK_TMP)/main && $(LOCK_TMP)/main/bin/pip install $(PIP) -e '.[test]'
	$(call write_lock,main)
	$(PYTHON) -m venv $(LOCK_TMP)/runpod && $(LOCK_TMP)/runpod/bin/pip install $(PIP) $(LOCK_TOPS_runpod)
	$(call write_lock,runpod)
	$(PYTHON) -m venv $(LOCK_TMP)/vastai && $(LOCK_TMP)/vastai/bin/pip install $(PIP) $(LOCK_TOPS_vastai)
	$(call write_lock,vastai)
	$(PYTHON) -m venv $(LOCK_TMP)/serve && $(LOCK_TMP)/serve/bin/pip install $(PIP) $(LOCK_TOPS_serve)
	$(call write_lock,serve)
	$(PYTHON) -m venv $(LOCK_TMP)/docs && $(LOCK_TMP)/docs/bin/pip install $(PIP) $(LOCK_TOPS_docs)
	$(call write_lock,docs)
	$(PYTHON) -m venv $(LOCK_TMP)/airflow && $(LOCK_TMP)/airflow/bin/pip install $(PIP) $(LOCK_TOPS_airflow)
	$(call write_lock,airflow)
	rm -rf $(LOCK_TMP)

# rfc3987-syntax (and lark, which only it needs) come with jsonschema's optional format-nongpl
# extra, which jupyter-events asks for; jsonschema imports it whenever it is installed, and it
# compiles some 35 Earley grammars at import: 1.5 s on every process that imports nbformat (each
# `runbook` phase), for an "iri" format no notebook schema uses (jsonschema issue #1428). The
# locks leave it out; `pip check` accepts that, as an extra's packages are optional.
LOCK_OMIT := '^(lark|rfc3987-syntax)=='
define write_lock
	{ head -3 locks/$(1).txt; $(LOCK_TMP)/$(1)/bin/pip freeze --exclude-editable | grep -v '^#' | grep -Ev $(LOCK_OMIT) | \
		sed 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/'; } > $(LOCK_TMP)/$(1).txt && mv $(LOCK_TMP)/$(1).txt locks/$(1).txt
endef

# The end-to-end tier (tests/README.md): every case, three at a time on 2 cores (pytest-xdist; a
# case mostly waits: on a server, a fixed arrival rate, the host lock). A case whose
# verdict rests on phase 04's measurement (marked `measure`) is safe beside another whole run
# because every runbook run on a machine holds the host lock (runbook_lib/run/hostlock.py): phases 04
# and 05 exclusively, so nothing else of the runbook's runs while they time the sides. The readers
# of a shared run go to one worker (tests/conftest.py). It prints the 25 slowest cases, so a new
# case's cost shows in the CI log. test-e2e-parallel and test-e2e-measure run one marker's cases.
# tests/bare-host runs the tier with no credential in its environment, no GPU visible and (as
# root) no network but loopback: what the README says a fresh machine needs.
e2e-setup: $(STAMP) $(VASTAI_STAMP) $(RUNPOD_STAMP) $(AIRFLOW_STAMP) demo-service-models browser haproxy

E2E_PYTEST := tests/bare-host $(PY) -m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder --durations=40

test-e2e: e2e-setup
	$(E2E_PYTEST) -m "e2e and not smoke"

test-e2e-parallel: e2e-setup
	$(E2E_PYTEST) -m "e2e and not smoke and not measure"

test-e2e-measure: e2e-setup
	$(E2E_PYTEST) -m "e2e and measure and not smoke"

# The browser tests drive Debian's chromium package with Playwright (the Python package, from the
# test extras; no browser is ever downloaded), and read the report's PDF with pdftotext
# (poppler-utils). Installing them needs root, as in CI; elsewhere the browser tests skip and say
# why, unless CI is set.
browser:
	@(command -v chromium && command -v pdftotext) >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium poppler-utils >/dev/null)

# The router tests drive Debian's haproxy (2.6 on Debian 12) through its runtime API; installed the
# same way, as root (as in CI), and those tests fail rather than skip when CI is set.
haproxy:
	@command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null)

# JupyterLab on this project with its kernel (.venv), bound to loopback; it prints the URL with its
# login token (random unless JUPYTER_TOKEN is set). LAB_DIR, LAB_PORT and LAB_ARGS adjust it; as
# root (a container) it passes --allow-root.
LAB_DIR ?= $(CURDIR)
LAB_PORT ?= 8888
LAB_ARGS ?=
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
		--ServerApp.root_dir="$(LAB_DIR)" --LabApp.default_url=/lab/tree/notebooks \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run_phases.py params/demo.yaml

# The streaming measurement path against a bare httpx streaming loop on the same server (target: within 5 %).
bench-streaming: $(STAMP) demo-service-models
	$(PY) benchmarks/streaming.py

soak: $(STAMP)
	$(PY) benchmarks/soak.py --runs 20

clean:
	rm -rf .runbook reports/*/ reports/*.html reports/*.pdf $(VENV) .venv-vastai .venv-runpod .venv-serve .venv-docs site
