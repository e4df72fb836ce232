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
# A program is native/NAME.c and, for one split by concern, every .c of its own directory
# (setup.py's PROGRAMS says which: exec/ for corral-exec, client/ for corral-client); the
# headers there are prerequisites too.
NATIVE = src/corral/native
NATIVE_CFLAGS = -O2 -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong
src/corral/_bin/corral-exec: $(wildcard $(NATIVE)/exec/*.c $(NATIVE)/exec/*.h)
src/corral/_bin/corral-client: $(wildcard $(NATIVE)/client/*.c $(NATIVE)/client/*.h)
src/corral/_bin/%: $(NATIVE)/%.c
	mkdir -p src/corral/_bin
	$(CC) $(NATIVE_CFLAGS) -static -o $@ $(filter %.c,$^) \
	  || $(CC) $(NATIVE_CFLAGS) -o $@ $(filter %.c,$^)

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
