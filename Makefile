# latch — build, test and lint. Everything is fetched through Go modules.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
BINARIES := $(notdir $(wildcard cmd/*))
BIN_DIR ?= bin
TEST_TIMEOUT ?= 25m
# make test runs this many test binaries at once (go test -p). The
# end-to-end packages spend most of their time waiting (leader election,
# the kubelet's and kube-controller-manager's periods, the API server):
# test/interop and test/e2e/kubelet together used 17 % of the machine's CPU
# time run one at a time. Four at a time on 2 cores took the warm suite
# from about 12 to about 6½ minutes, and a cold make test after make demo
# from 15 to 9 (README, "Measured figures").
TEST_PARALLEL ?= 4
# The longest packages first, so that none of them starts last (go test
# starts packages in the order given; a package named twice runs once):
# the order of their run times on a fresh machine. test/deploy compiles a
# lot on a cold cache (the image's cross-compiles, crane) and
# internal/latchlocal runs minutes of walks: listed after ./... (as
# before) they started last and ended last, minutes after the rest.
TEST_PACKAGES ?= ./test/interop/ ./test/e2e/attacher/ ./test/deploy/ ./test/e2e/reliability/ ./test/e2e/... ./internal/latchlocal/ ./bench/ ./cmd/latch-local/ ./internal/localcluster/ ./internal/attachdetach/controller/ ./...
# grpcnotrace leaves out gRPC's golang.org/x/net/trace support (never
# served by latch), whose html/template makes the linker keep every exported
# method: csi-attacher's binary shrinks from 78 to 48 MB and its resident
# code pages by about 10 MB (docs/performance.md). Images and `make bench`
# build with the same tag.
BUILD_TAGS ?= grpcnotrace

.PHONY: all build tools test lint fmt vet staticcheck demo up clean soak image image-docker bench bench-scale bench-objects bench-peers upgrade-test upstream-mods

all: build

## build: compile every binary into ./bin, and bin/kubectl-latch (latchctl as a kubectl plugin) with bin/kubectl_complete-latch (what kubectl runs to complete `kubectl latch`)
build:
	@mkdir -p $(BIN_DIR)
	$(GO) build -tags $(BUILD_TAGS) -o $(BIN_DIR)/ ./cmd/...
	cp $(BIN_DIR)/latchctl $(BIN_DIR)/kubectl-latch
	cp $(BIN_DIR)/latchctl $(BIN_DIR)/kubectl_complete-latch

# demo, up and test compile a lot on a first run (the in-process
# kube-apiserver, and the real kube-scheduler, kube-controller-manager and
# kubelet): they say so in one line, then hack/buildprogress (standard
# library only, built first with go build -v so even its own compile shows)
# prints "[n/N packages] compiling <pkg>, <elapsed>" every 5 to 10 s.
PROGRESS := $(BIN_DIR)/buildprogress
BUILD_PROGRESS := mkdir -p $(BIN_DIR) && $(GO) build -v -o $(PROGRESS) ./hack/buildprogress
COLD := minutes on 2 cores with an empty Go build cache (more with an empty module cache: the downloads), seconds when warm
# On a cold machine, make demo and make up first download latch's modules
# in the background (while buildprogress compiles: downloads use the
# network, compiles the cores), and compile what latch-local's upstream
# binaries import (internal/testsupport's components built together) while
# latch-local links; latch-local then only links them (README, "The first
# run is long"; hack/buildprogress/warm.go).
DOWNLOAD := ($(GO) list -deps ./cmd/latch-local >/dev/null 2>&1 &)
UPSTREAM_WARM := -warm-dir test/upstream/kubernetes -warm "github.com/latchcsi/latch/test/upstream/kubernetes/hollowkubelet k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler"

## tools: what the tests run besides Go: promtool and prometheus (the alert rules' unit tests, the dashboard and rules against latch-local), from Debian's prometheus package, installed with apt-get when missing
tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
		echo "make tools: promtool or prometheus is missing; installing Debian's prometheus package (apt-get install prometheus)"; \
		if [ "$$(id -u)" = 0 ]; then sudo=; else sudo="sudo -n"; fi; \
		{ $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || { \
			echo "make tools: could not install Debian's prometheus package (needs root, or sudo without a password, and Debian's package archive). Install it yourself: apt-get update && apt-get install -y prometheus; the tests of the alert rules and the dashboard fail without promtool and prometheus." >&2; exit 1; }; \
		command -v promtool >/dev/null && command -v prometheus >/dev/null || { echo "make tools: Debian's prometheus package is installed but promtool or prometheus is not on PATH" >&2; exit 1; }; \
	fi

## test: the whole suite, unit and end-to-end, on an in-process control plane
# The packages the tests import are compiled first with progress (go build:
# no test binary is linked twice), then go test runs as before: its summary
# lines on standard output, a heartbeat on standard error while it is silent.
# make tools runs first: some tests run promtool and prometheus.
test: tools
	@echo "make test: a first run compiles every package and test binary (kube-apiserver in-process; kube-controller-manager, kube-scheduler and kubelet for the upstream tests): $(COLD); then the tests run for minutes (README: first run). Progress follows."
	@$(BUILD_PROGRESS)
	@$(PROGRESS) test -label "make test" -- $(GO) test -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(TEST_PACKAGES)

## test-versions: the core end-to-end scenarios against Kubernetes 1.34, 1.35, 1.36 and 1.37, each minor's kube-apiserver, kube-controller-manager, kube-scheduler and hollow kubelet built from its module under test/upstream and kept between runs; prints a table (VERSIONS=1.34,1.35 and SCENARIOS=multi-attach,... choose; docs/upgrade.md, "Tested Kubernetes versions")
.PHONY: test-versions
test-versions:
	@echo "make test-versions: a first run builds each minor's kube-apiserver, kube-controller-manager, kube-scheduler and kubelet (18 to 31 minutes each on two shared cores), then runs the scenarios of each minor (about 5 minutes each). Progress follows; the table comes last."
	$(GO) run ./hack/testversions $(if $(VERSIONS),-versions=$(VERSIONS)) $(if $(SCENARIOS),-scenarios=$(SCENARIOS)) -out $(BIN_DIR)/test-versions

## bench: benchmarks A–F on a local control plane (SCALE=small|full, SCENARIOS=A,B,..., PROFILE=1, ATTACHER=path, ATTACHER_FLAGS=..., CONTROLLER_FLAGS=..., POD_CREATORS=N, VA_CREATORS=N, CONTROL_PLANE_GOGC=N, CONTROL_PLANE_MEMORY_LIMIT_MIB=N); see docs/performance.md
SCALE ?= full
bench:
	$(GO) run ./bench/cmd/latch-bench --scale=$(SCALE) $(if $(SCENARIOS),--scenarios=$(SCENARIOS)) $(if $(PROFILE),--profile=bench/results/profiles) $(if $(ATTACHER),--attacher-binary=$(ATTACHER)) $(if $(ATTACHER_FLAGS),--attacher-flags="$(ATTACHER_FLAGS)") $(if $(CONTROLLER_FLAGS),--controller-flags="$(CONTROLLER_FLAGS)") $(if $(POD_CREATORS),--pod-creators=$(POD_CREATORS)) $(if $(VA_CREATORS),--va-creators=$(VA_CREATORS)) $(if $(CONTROL_PLANE_GOGC),--control-plane-gogc=$(CONTROL_PLANE_GOGC)) $(if $(CONTROL_PLANE_MEMORY_LIMIT_MIB),--control-plane-memory-limit-mib=$(CONTROL_PLANE_MEMORY_LIMIT_MIB))

## bench-peers: latch's csi-attacher and attachdetach-controller beside upstream external-attacher v4.13, kube-controller-manager v1.37.2 and latch's previous release (PREVIOUS=<git revision>, default 0c7ab01: v0.1.0; skipped in a shallow clone) in interleaved rounds (ROUNDS=N, default 3; SCALE=small|full; WORKLOADS=latency,backends,controllers to run only some; FIXED_LATENCY=1 runs latch fixed in the latency workload too; BACKEND_BUDGET=3m bounds each backend burst, default 5m at full; BACKEND_SEED=N draws the backend profiles' latencies from another seed): medians and ratios, JSON in bench/results/ (docs/performance.md, "Against upstream")
ROUNDS ?= 3
PREVIOUS ?= 0c7ab01
bench-peers:
	$(GO) run ./bench/cmd/latch-bench-peers --scale=$(SCALE) --rounds=$(ROUNDS) --previous=$(PREVIOUS) $(if $(WORKLOADS),--workloads=$(WORKLOADS)) $(if $(FIXED_LATENCY),--fixed-latency) $(if $(BACKEND_BUDGET),--backend-budget=$(BACKEND_BUDGET)) $(if $(BACKEND_SEED),--backend-seed=$(BACKEND_SEED))

## bench-scale: the scale scenario (docs/scale.md): every volume attached, then csi-attacher, attachdetach-controller and kube-controller-manager cold-started on the same objects, then for each controller a trickle of Pods and a recovery burst (SIZE=small|medium|full; full = 10,000 nodes, 100,000 volumes; NO_KCM=1 leaves kube-controller-manager out; CONTROLLER_FLAGS="--node-status-workers=32" gives latch's controller extra flags)
SIZE ?= small
bench-scale:
	$(GO) run ./bench/cmd/latch-scale --size=$(SIZE) $(if $(NO_KCM),--no-kcm) $(if $(CONTROLLER_FLAGS),--controller-flags="$(CONTROLLER_FLAGS)")

## bench-objects: heap bytes per VA, PV, Pod, Node, PVC and CSINode in each controller's caches, with and without its transforms, and the projection to 10,000 nodes / 100,000 volumes (docs/scale.md "Per-object cost"; OBJ_NODES=1000 OBJ_VOLUMES=10000; OBJ_FAKE=1 builds the objects on a fake clientset instead of the API server); JSON in bench/results/
OBJ_NODES ?= 1000
OBJ_VOLUMES ?= 10000
bench-objects:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench '^BenchmarkObjectCost$$' -benchtime 1x ./bench/ -args -objcost.nodes=$(OBJ_NODES) -objcost.volumes=$(OBJ_VOLUMES) -objcost.out=$(CURDIR)/bench/results $(if $(OBJ_FAKE),-objcost.fake)

## soak: the long seeded chaos run (LATCH_SOAK=1; replay a run with LATCH_CHAOS_SEED=<seed>)
soak:
	LATCH_SOAK=1 $(GO) test -count=1 -timeout 30m -v -run '^TestChaos' ./test/e2e/reliability/

## upgrade-test: an older latch (UPGRADE_FROM=<git revision>, default 0c7ab01: v0.1.0, built from the git history) upgraded to this checkout's build and rolled back, with volumes in flight (docs/upgrade.md); needs the git history (a shallow clone: git fetch --unshallow)
UPGRADE_FROM ?= 0c7ab01
upgrade-test:
	LATCH_UPGRADE_FROM=$(UPGRADE_FROM) $(GO) test -count=1 -timeout 20m -tags upgrade -run '^TestUpgrade' -v ./test/interop/

## upstream-mods: build the upstream components under test/upstream (kube-controller-manager, kube-scheduler, the hollow kubelet, external-attacher) with latch's dependency versions again after a change to go.mod: every shared dependency replaced by latch's version but the few each keeps, each module tidied (test/upstream/README.md)
upstream-mods:
	$(GO) run ./hack/upstreammods

## demo: the whole attach/detach path in one process (latch-local demo)
# latch-local is built into $(BIN_DIR) with progress and run from there; it
# prints what it builds of the upstream binaries and their progress. No
# BUILD_TAGS: the tests build without them, and grpcnotrace would make a cold
# machine compile gRPC and everything above it (etcd, the API server) twice.
demo:
	@echo "make demo: a first run compiles latch-local (kube-apiserver and etcd in-process), then kube-scheduler, kube-controller-manager and the kubelet: $(COLD) (README: first run). Progress follows."
	@$(DOWNLOAD)
	@$(BUILD_PROGRESS)
	@$(PROGRESS) build -label "make demo" $(UPSTREAM_WARM) -o $(BIN_DIR)/latch-local ./cmd/latch-local -- $(BIN_DIR)/latch-local demo

## up: keep a local control plane with nodes, driver and controllers running
up:
	@echo "make up: a first run compiles latch-local (kube-apiserver and etcd in-process), then kube-scheduler, kube-controller-manager and the kubelet: $(COLD) (README: first run). Progress follows."
	@$(DOWNLOAD)
	@$(BUILD_PROGRESS)
	@$(PROGRESS) build -label "make up" $(UPSTREAM_WARM) -o $(BIN_DIR)/latch-local ./cmd/latch-local -- $(BIN_DIR)/latch-local up

## image: OCI images of every released binary for linux/amd64 and linux/arm64, from Go modules alone (no container engine): an OCI image layout per binary in bin/images/<binary> (a multi-platform index, tagged IMAGE_TAG), an SPDX SBOM per platform beside it and attached to its image; prints each digest and size and the push command (docs/deploy.md, "Images")
IMAGE_REGISTRY ?= ghcr.io/latchcsi
# The release version, written once in internal/version/VERSION.
IMAGE_TAG ?= $(shell cat internal/version/VERSION)
IMAGE_BINARIES := $(shell sed -n 's/^FROM runtime AS //p' build/Dockerfile)
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_DIR ?= $(BIN_DIR)/images
image:
	$(GO) run ./hack/image -o $(IMAGE_DIR) -platforms $(IMAGE_PLATFORMS) -tags "$(BUILD_TAGS)" -tag $(IMAGE_TAG) -repository $(IMAGE_REGISTRY) $(IMAGE_BINARIES)

## image-docker: the same binaries as images on distroless, built by Docker with BuildKit from build/Dockerfile into the local engine (its base is pinned by tag only: the image target is the reference)
image-docker:
	for b in $(IMAGE_BINARIES); do \
		DOCKER_BUILDKIT=1 docker build -f build/Dockerfile --build-arg BINARY=$$b --target $$b \
			-t $(IMAGE_REGISTRY)/$$b:$(IMAGE_TAG) . || exit 1; \
	done

## lint: gofmt, go vet and staticcheck (installed from the Go module proxy)
lint: fmt vet staticcheck

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

clean:
	rm -rf $(BIN_DIR)
