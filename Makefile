# The two commands of the README: `make demo` and `make test`.
GO      ?= go
GOFLAGS ?=
export GOTOOLCHAIN ?= local

.PHONY: demo test deps build vet fmt-check rules observability docs bench fuzz clean

# What `hastate version`, hastate_build_info and the first log line say.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
VERSION_PKG := github.com/hastate/hastate/internal/version
LDFLAGS  := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/hastate ./cmd/hastate

# deps: a Consul binary (found or built once, cached outside the tree) and HAProxy.
deps:
	@scripts/ensure-haproxy.sh
	@scripts/ensure-consul.sh >/dev/null

demo: build deps
	CONSUL_BIN=$$(scripts/ensure-consul.sh) scripts/demo.sh

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

test: deps vet fmt-check rules
	CONSUL_BIN=$$(scripts/ensure-consul.sh) $(GO) test -race -count=1 -timeout 40m ./...
	# Allocation counts need a build without -race (it makes sync.Pool drop items).
	$(GO) test -count=1 -run 'Alloc' ./server ./state
	$(MAKE) observability

# rules: the alert rules are valid and each alert fires, or stays silent, as its tests say.
rules:
	@PROMTOOL=$$(scripts/ensure-promtool.sh) && \
	$$PROMTOOL check rules deploy/prometheus/alerts.yaml && \
	cd deploy/prometheus && $$PROMTOOL test rules alerts_test.yaml

# observability: every PromQL expression of the alerts and the dashboard
# parses, the dashboard is well formed, and every metric they use exists on
# a running hastate (its own module: the Prometheus parser stays out of go.mod).
observability:
	cd test/observability && CONSUL_BIN=$$(../../scripts/ensure-consul.sh) PROMTOOL=$$(../../scripts/ensure-promtool.sh) \
		$(GO) test -count=1 -timeout 10m ./...

# docs: regenerate docs/metrics.md from a running replica's registry.
docs:
	CONSUL_BIN=$$(scripts/ensure-consul.sh) $(GO) test -count=1 -run TestMetricsCatalogue ./internal/app -update

# Benchmarks report ratios against baselines measured in the same run.
bench: deps
	CONSUL_BIN=$$(scripts/ensure-consul.sh) $(GO) test -run '^$$' -bench 'AgentCheckRatio|Propagation' -benchtime 1x -timeout 30m ./test/

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseValue -fuzztime 30s ./state
	$(GO) test -run '^$$' -fuzz FuzzParseRequest -fuzztime 30s ./state

clean:
	rm -rf bin .demo
