# The only developer entry points. CI runs .ci/run, which calls `make ci`.
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
CC ?= cc

.PHONY: setup native fmt check test test-unit test-contract test-integration schema bench ci clean

setup: $(BIN)/python native  ## create the virtualenv with corral (editable) and the dev tools
$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'

native: src/corral/_bin/corral-exec src/corral/_bin/corral-client src/corral/_bin/corral-vm-agent src/corral/_bin/corral-vm-relay  ## build the native programs in place (editable installs)
src/corral/_bin/%: src/corral/native/%.c
	mkdir -p src/corral/_bin
	$(CC) -O2 -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong -static -o $@ $< \
	  || $(CC) -O2 -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong -o $@ $<

fmt:
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

check:  ## lint, format, types, generated files
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/python -m corral.policy._schema --check
	$(BIN)/python -m corral.cli._reference --check

test: native  ## the whole suite (what CI runs)
	$(BIN)/python -m pytest -q

test-unit:
	$(BIN)/python -m pytest -q tests/unit tests/repo

test-contract: native
	$(BIN)/python -m pytest -q tests/contract

test-integration: native
	$(BIN)/python -m pytest -q tests/integration

schema:  ## regenerate the JSON Schema, the policy reference and the man page
	$(BIN)/python -m corral.policy._schema --write
	$(BIN)/python -m corral.cli._reference --write

bench:
	$(BIN)/corral bench

ci:  ## what .ci/run does after installing system packages
	$(BIN)/python -m corral.policy._schema --check
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build dist src/corral/_bin .pytest_cache .mypy_cache .ruff_cache
