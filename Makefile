# GPU Runbook Bot — the two commands: `make demo` and `make test`.
#
# Both set up everything they need on a fresh Debian machine: Debian packages
# (when run as root), a virtualenv in .venv, and the lab started by deploy/lab/lab.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB := deploy/lab/lab
# PostgreSQL for the store's tests, rsyslog (and its TLS driver) for the audit shipping's,
# Chromium for the console's browser tests (driven by Playwright, never its own browsers),
# debootstrap for the lab's newer Slurm (24.11, 26.05 from Debian roots: lab up --slurm);
# zsh for the shell completion tests;
# the lab installs its own packages (Slurm, MariaDB...).
DEBIAN_PACKAGES := postgresql rsyslog rsyslog-openssl chromium debootstrap zsh

.PHONY: demo test lint unit bench mutate deps venv lab-up lab-down clean image

venv: $(STAMP)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Debian packages the tests need; as root on Debian they are installed, elsewhere listed.
deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 2; \
	  fi; \
	fi

lint: venv
	$(BIN)/ruff check kit bot adapters tests bench deploy/lab
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole suite; the lab is started once by a pytest fixture and stopped at the end.
test: deps venv lint
	@# byte-compiled first: where PYTHONDONTWRITEBYTECODE is set, every `runbook` process the
	@# suite starts (hundreds) would otherwise compile the project's modules again
	$(BIN)/python -m compileall -q -j 0 kit bot adapters deploy/lab tests >/dev/null
	@# the lab's tests (one at a time: they share the lab) beside the tests that need no
	@# server, then those on their own PostgreSQL or podman; see tests/run-suite
	BIN=$(BIN) tests/run-suite

unit: venv
	$(BIN)/pytest -q -n auto -m "not lab and not ownlab and not postgres and not image"

bench: venv
	$(BIN)/python bench/engine_overhead.py
	$(BIN)/python bench/audit_throughput.py
	$(BIN)/python bench/cold_start.py
	$(BIN)/python bench/alert_webhook.py
	$(BIN)/python bench/console.py
	@# these three start labs of their own (temporary folders, their own ports)
	$(BIN)/python bench/slurm_drain.py
	$(BIN)/python bench/k8s_fleet_drain.py
	$(BIN)/python bench/plan_fleet.py
	@# the shared lab, held under its lock as the lab tests hold it (some drain its nodes)
	flock /tmp/grb-lab.lock sh -c '$(LAB) up && eval "$$($(LAB) env)" && $(BIN)/python bench/node_view.py && $(BIN)/python bench/slack_ack.py && $(BIN)/python bench/slowloris.py && $(BIN)/python bench/cancel_to_undone.py && $(BIN)/python bench/failover.py'

# Mutation testing of the safety core (mutmut; modules and tests in deploy/mutate/modules.toml).
# Not part of `make test`: see docs/safety.md for how long it takes.
mutate: venv
	$(BIN)/python bench/mutate.py

# The container image (podman; the base image is made locally from Debian's packages).
image: venv
	deploy/image/build

demo: venv
	bash deploy/demo.sh

lab-up:
	$(LAB) up

lab-down:
	$(LAB) down

clean:
	-$(LAB) down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
