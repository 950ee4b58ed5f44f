# The two commands of the README: `make demo` and `make test`.
GO      ?= go
GOFLAGS ?=
export GOTOOLCHAIN ?= local

.PHONY: demo demo-reset test deps build vet fmt-check rules observability browser docs bench fuzz clean image chart-files chart-readme test-deploy soak soak-mixed mutate

# What `hastate version`, hastate_build_info and the first log line say.
VERSION  ?= $(shell cat VERSION 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
VERSION_PKG := github.com/hastate/hastate/internal/version
LDFLAGS  := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/hastate ./cmd/hastate

# image: a static binary (CGO_ENABLED=0, -trimpath, stamped as `build` does)
# copied onto $(BASE) with Debian's podman (daemonless, vfs storage: works
# without overlay or a daemon), tagged $(IMAGE):<version> and $(IMAGE):latest
# and saved as the OCI archive bin/hastate-image.tar. Offline: BASE=scratch.
IMAGE      ?= hastate
# The Dockerfile's pinned base (deploy/test checks they are the same).
BASE       ?= gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
IMAGE_TAG  := $(subst +,-,$(VERSION))
PODMAN     ?= podman --storage-driver vfs
PODMAN_BUILD_FLAGS ?= --network host --ulimit nofile=1024:4096 --ulimit nproc=1024:4096

image:
	@scripts/ensure-podman.sh
	@mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/image/hastate ./cmd/hastate
	$(PODMAN) build $(PODMAN_BUILD_FLAGS) -f Dockerfile \
	  --build-arg BASE=$(BASE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	  -t $(IMAGE):$(IMAGE_TAG) -t $(IMAGE):latest bin/image
	@rm -f bin/hastate-image.tar
	$(PODMAN) save --format oci-archive -o bin/hastate-image.tar $(IMAGE):$(IMAGE_TAG)
	@echo "image: $(IMAGE):$(IMAGE_TAG) $(IMAGE):latest -> bin/hastate-image.tar"

# deps: a Consul binary (found or built once, cached outside the tree) and
# HAProxy. `make test` and `make bench` also get HAProxy 3.0 LTS (built once
# from Debian trixie's source package by scripts/ensure-haproxy3.sh, about
# 2.5 minutes, cached outside the tree); the demo does not need it.
deps:
	@scripts/ensure-haproxy.sh
	@scripts/ensure-consul.sh >/dev/null

# demo: resumes the earlier demo's data in .demo (Consul, raft, logs);
# demo-reset starts afresh. Prometheus (Debian's, from the same package as
# promtool) is optional: without it the demo says what it cannot show.
demo: build deps
	@scripts/ensure-promtool.sh >/dev/null || echo "demo: continuing without Prometheus"
	CONSUL_BIN=$$(scripts/ensure-consul.sh) scripts/demo.sh

demo-reset: build deps
	@scripts/ensure-promtool.sh >/dev/null || echo "demo: continuing without Prometheus"
	CONSUL_BIN=$$(scripts/ensure-consul.sh) scripts/demo.sh --reset

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

test: deps vet fmt-check rules
	@scripts/ensure-haproxy3.sh >/dev/null
	CONSUL_BIN=$$(scripts/ensure-consul.sh) HAPROXY3_BIN=$$(scripts/ensure-haproxy3.sh) $(GO) test -race -count=1 -timeout 40m ./...
	# Allocation counts need a build without -race (it makes sync.Pool drop items).
	$(GO) test -count=1 -run 'Alloc' ./server ./state ./cluster/confirm
	# The safety rules' table still names code that exists (make mutate runs it).
	cd test/mutate && $(GO) vet . && $(GO) run . -repo ../.. -check
	$(MAKE) observability
	$(MAKE) browser
	$(MAKE) test-deploy

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

# browser: the status page rendered by Debian's headless chromium (installed
# by scripts/ensure-chromium.sh) against a running hastate and Consul; the
# screenshots land in test/browser/artifacts/ (its own module: chromedp
# stays out of go.mod).
browser:
	cd test/browser && $(GO) vet ./... && \
	  CONSUL_BIN=$$(../../scripts/ensure-consul.sh) CHROMIUM_BIN=$$(../../scripts/ensure-chromium.sh) \
	  $(GO) test -v -count=1 -timeout 10m ./...

# docs: regenerate docs/metrics.md from a running replica's registry.
docs:
	CONSUL_BIN=$$(scripts/ensure-consul.sh) $(GO) test -count=1 -run TestMetricsCatalogue ./cmd/hastate/internal/app -update

# chart-files: Helm reads only files inside the chart, so the single sources
# of the alert rules and the dashboard are copied into it (byte for byte,
# tracked by git: see deploy/helm/hastate/files/README.md). A copy whose
# source is gone is removed.
CHART       := deploy/helm/hastate
CHART_FILES := deploy/prometheus/alerts.yaml deploy/grafana/hastate.json

# It also stamps VERSION into Chart.yaml's version and appVersion (the
# default image tag), so that the chart and the binary of a release agree
# (deploy/test checks it).
# chart-readme: the chart README's values table, generated from values.yaml
# and its comments (deploy/test's TestChartREADME fails when it drifts).
chart-readme:
	cd deploy/test && UPDATE_CHART_README=1 $(GO) test -count=1 -run TestChartREADME .

chart-files:
	@for src in $(CHART_FILES); do dst=$(CHART)/files/$$(basename $$src); \
	  if [ -f $$src ]; then cmp -s $$src $$dst || { cp $$src $$dst; echo "chart-files: $$src -> $$dst"; }; \
	  elif [ -f $$dst ]; then rm -f $$dst; echo "chart-files: $$src is gone: removed $$dst"; fi; \
	done
	@v=$$(cat VERSION); sed -e "s/^version: .*/version: $$v/" -e "s/^appVersion: .*/appVersion: \"$$v\"/" $(CHART)/Chart.yaml > $(CHART)/Chart.yaml.new; \
	  if cmp -s $(CHART)/Chart.yaml $(CHART)/Chart.yaml.new; then rm $(CHART)/Chart.yaml.new; \
	  else mv $(CHART)/Chart.yaml.new $(CHART)/Chart.yaml; echo "chart-files: Chart.yaml version and appVersion set to $$v (VERSION)"; fi

# test-deploy: what ships outside the binary. helm lint (with the one value
# an install must give, the Consul token's Secret), terraform fmt (when
# terraform is installed: providers cannot be fetched, so no init/validate),
# the image built offline (BASE=scratch) with podman, then the
# Go tests of deploy/test (its own module: the Helm SDK and k8s.io/api stay
# out of go.mod), the container test included (podman is installed first).
test-deploy: chart-files build
	@scripts/ensure-podman.sh
	$$(scripts/ensure-helm.sh) lint --strict --set consul.existingSecret.name=hastate-consul $(CHART)
	# ... and with its other required value and a certificate Secret, so that
	# every template renders: helm lint cannot be told which APIs the cluster
	# serves, and without cert-manager.io/v1 the chart's capability check
	# stops the render (deploy/test renders the cert-manager objects with it).
	$$(scripts/ensure-helm.sh) lint --strict --set consul.existingSecret.name=hastate-consul $(CHART) --set 'haproxyCIDRs={10.20.0.0/16}' --set raftTLS.existingSecret=raft-certs
	@if command -v terraform >/dev/null 2>&1; then terraform fmt -check -recursive deploy/terraform; \
	else echo "test-deploy: terraform not installed: skipping terraform fmt (the HCL tests still run)"; fi
	$(MAKE) image BASE=scratch
	cd deploy/test && $(GO) vet ./... && \
	  HASTATE_BIN=$(CURDIR)/bin/hastate HASTATE_IMAGE_ARCHIVE=$(CURDIR)/bin/hastate-image.tar \
	  CONSUL_BIN=$$($(CURDIR)/scripts/ensure-consul.sh) $(GO) test -count=1 -timeout 20m ./...

# Benchmarks report ratios against baselines measured in the same run:
# agent-check throughput against a minimal responder, confirmed answers on
# a three-replica cluster's leader and follower against a bare responder
# in its own process (LeaderRoundCost; it builds an older revision from
# git as its second cluster) and where their CPU goes (ConfirmCPU), one
# write's propagation, the scale table (one change at 1k, 10k and 50k keys
# against Consul's own listing time), a backend-wide ramp (raft entries,
# other servers' latency before and during), the operator commands and
# the agent beside a 200,000- and a 1,000,000-pair poller table
# (FleetOperator, PollerTable) and the reload window of a drained server
# per HAProxy release and configuration (against production's check
# intervals). cluster/DESIGN.md and server/DESIGN.md explain each figure.
bench: deps
	@scripts/ensure-haproxy3.sh >/dev/null
	CONSUL_BIN=$$(scripts/ensure-consul.sh) HAPROXY3_BIN=$$(scripts/ensure-haproxy3.sh) $(GO) test -run '^$$' -bench 'AgentCheckRatio|LeaderRoundCost|ConfirmCPU|Propagation|Scale|BackendRamp|FleetOperator|PollerTable|ReloadWindow' -benchtime 1x -timeout 90m ./test/

# soak: the fault-injection test (test/nemesis_e2e_test.go) on SOAK_SEEDS
# seeds (default 20, one after another from a fresh seed, each logged) of
# SOAK (default 2m) of faults each, instead of make test's one seed of 30s;
# each seed's history is judged by porcupine and its figures (operations
# checked, violations, longest withheld stretch, what each token fault did)
# end the log.
# HASTATE_NEMESIS_SEED=<n> starts from seed n (SOAK_SEEDS=1 repeats one).
SOAK ?= 2m
SOAK_SEEDS ?= 20
soak: deps
	CONSUL_BIN=$$(scripts/ensure-consul.sh) HASTATE_NEMESIS_DURATION=$(SOAK) HASTATE_NEMESIS_SEEDS=$(SOAK_SEEDS) \
	  $(GO) test -race -count=1 -v -run '^TestE2ENemesis$$' -timeout 6h ./test/

# mutate: removes each safety rule listed in test/mutate/mutations.go, one
# at a time, from a copy of the tree, runs its package's tests and prints
# which test caught it; fails on a rule no test misses. Not part of `make
# test` (about 30 minutes on two shared cores: each mutation rebuilds and
# reruns its package). docs/safety-rules.md tables the rules and tests.
mutate:
	cd test/mutate && CONSUL_BIN=$$(../../scripts/ensure-consul.sh) $(GO) run . -repo ../..

# soak-mixed: the soak with the last replica on the previous release
# (test/testdata/previous-release), every fault kind but the token's.
soak-mixed: deps
	CONSUL_BIN=$$(scripts/ensure-consul.sh) HASTATE_NEMESIS_MIXED=1 HASTATE_NEMESIS_DURATION=$(SOAK) HASTATE_NEMESIS_SEEDS=$(SOAK_SEEDS) \
	  $(GO) test -race -count=1 -v -run '^TestE2ENemesis$$' -timeout 6h ./test/

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseValue -fuzztime 30s ./state
	$(GO) test -run '^$$' -fuzz FuzzParseRequest -fuzztime 30s ./state

clean:
	rm -rf bin .demo
