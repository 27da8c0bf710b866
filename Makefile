# muster: make help lists the targets.
SHELL := /usr/bin/env bash
K8S_VERSION := $(shell cat .k8s-version)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# kube-scheduler derives its compatibility version from gitVersion, so it
# must stay a Kubernetes version; muster's own version rides along.
LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION)-muster.$(subst -,.,$(VERSION)) \
           -X k8s.io/component-base/version.gitCommit=$(shell git rev-parse HEAD 2>/dev/null || echo unknown) \
           -X k8s.io/component-base/version.buildDate=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BINARIES ?= muster-scheduler tfconfig-controller muster-sim
GO_TEST_FLAGS ?=

.PHONY: help build test test-unit test-integration test-upstream fuzz verify generate demo bench bench-api clean

help: ## List the targets.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## Build the binaries into bin/.
	go build -ldflags "$(LDFLAGS)" -o bin/muster-scheduler ./cmd/scheduler
	go build -ldflags "$(LDFLAGS)" -o bin/tfconfig-controller ./cmd/tfconfig-controller
	go build -ldflags "$(LDFLAGS)" -o bin/muster-sim ./cmd/muster-sim
	go build -ldflags "$(LDFLAGS)" -o bin/kubectl-muster ./cmd/kubectl-muster

test: test-unit test-integration test-upstream ## Run all tests (unit, integration against an in-process control plane, then upstream's scheduler_perf workloads sized for integration).

test-unit: ## Unit tests (everything but test/integration), then every benchmark under pkg, cmd and internal once: one that no longer runs fails here, not in make bench.
	go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/integration)
	@mkdir -p out && echo "every benchmark once (log in out/bench-smoke.log)" && \
	go test $(GO_TEST_FLAGS) -run '^$$' -bench . -benchtime 1x \
		$$(grep -rl --include='*_test.go' '^func Benchmark' pkg cmd internal | xargs -n1 dirname | sort -u | sed 's|^|./|') \
		>out/bench-smoke.log 2>&1; rc=$$?; grep -E '^(ok|FAIL|--- FAIL|panic)' out/bench-smoke.log; exit $$rc

test-integration: ## Integration tests: real etcd, kube-apiserver, Job controller and the muster scheduler, in process.
	go test $(GO_TEST_FLAGS) -timeout 30m ./test/integration/...

# Upstream's scheduler_perf workloads at 2 to 1000 nodes, run by muster alone as
# correctness tests through test/perf (the runner of make bench-perf): pods
# alone, with churn, native gangs, topology-aware gangs, gang preemption with
# and without PodGroups, disruption modes and a 1000-node preemption of pods
# alone. A run fails when upstream's harness finds a pod left unscheduled, or
# test/perf's placement check a PodGroup bound in part (or across racks for
# tas). etcd is built once into ~/.cache/muster-perf.
UPSTREAM_WORKLOADS := misc/SchedulingBasic/500Nodes,misc/SchedulingWithMixedChurn/1000Nodes,\
podgroup/gangscheduling/GangScheduling/100Nodes_10Gangs,podgroup/basicscheduling/BasicScheduling/100Nodes_10Groups,\
podgroup/tas/TopologyAwareScheduling/100Nodes_10Gangs,\
workload_preemption/GangPreemptionBasic/2Nodes_1PreemptorGang_2Pods_Evicting_10InitPods,\
workload_preemption/GangPreemptionPodGroups/2Nodes_1PreemptorGang_2Pods_Evicting_2LowPriorityGangs,\
workload_preemption/GangPreemptionPodGroups/100Nodes_10PreemptorGangs_10Pods_Evicting_50LowPriorityGangs,\
default_preemption/PreemptionPodGroupDisruptionMode/FastTest_PodGroupDisruptionMode_All,\
default_preemption/PreemptionPodGroupDisruptionMode/FastTest_PodGroupDisruptionMode_Single,\
default_preemption/PreemptionBasic/1000Nodes
test-upstream: ## Upstream's scheduler_perf workloads sized for integration (2-1000 nodes), run by muster: every pod scheduled, no PodGroup bound in part (log in out/test-upstream.log).
	etcd_dir=$$(hack/build-etcd.sh) && \
	go test -tags perf -c -o bin/perf.test ./test/perf/ && \
	rm -rf out/test-upstream && mkdir -p out/test-upstream && \
	PATH="$$etcd_dir:$$PATH" bin/perf.test -test.run '^$$' -test.bench '^BenchmarkPerf$$' -test.benchtime 1x -test.timeout 30m \
		-perf-schedulers=muster -perf-workloads='$(UPSTREAM_WORKLOADS)' \
		-data-items-dir=$(CURDIR)/out/test-upstream >out/test-upstream.log 2>&1; \
	rc=$$?; grep -E '^(--- FAIL|FAIL|PASS|ok|placement)|^ +[a-z_]+\.go:[0-9]+: .*([Ff]ail|[Ee]rror|timed out|partly bound)' out/test-upstream.log | cut -c1-300; \
	grep -E '^Benchmark' out/test-upstream.log | awk '{print $$1, $$3, $$4}'; \
	test $$rc = 0 || { echo "test-upstream failed (exit $$rc): see out/test-upstream.log" >&2; exit $$rc; }

.PHONY: e2e
E2E_FLAGS ?=
e2e: ## End-to-end: the real Kubeflow training-operator v1.8.1 and Kueue v0.17.0 beside muster (tools built once into the user cache; cold ~5 min).
	go run ./test/e2e/tools/build
	go test -tags e2e -run 'TestE2E' -timeout 45m ./test/integration $(E2E_FLAGS)

# A count, not a duration: with -fuzztime as a duration, Go 1.26's fuzz
# coordinator can fail a target with "context deadline exceeded" when the
# deadline races a worker's shutdown, no crasher found (golang/go#75804,
# fixed in Go 1.27). A count has no deadline to race. 50000 executions take
# 5-15 s per target on a 2-core machine.
FUZZTIME ?= 50000x
FUZZ_TARGETS := ./pkg/gang:FuzzAnnotations ./pkg/gang:FuzzKeyOf ./pkg/apis/config/v1:FuzzValidateArgs ./pkg/controller/tfconfig:FuzzBuildClusterSpec

# -fuzzminimizetime 0: with a fresh corpus, the workers stalled for seconds
# minimizing each new interesting input. A crasher is still reported,
# unminimized.
fuzz: ## Run every fuzz target briefly (FUZZTIME each, default 50000 executions).
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $(FUZZTIME)"; \
		go test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 0 $${t%%:*} || exit 1; \
	done

verify: ## gofmt, go vet, go mod tidy leaves no diff, generated code is up to date.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	go vet ./...
	hack/verify-gomod.sh
	hack/verify-codegen.sh

generate: ## Regenerate deepcopy, conversion and defaulting code (pkg/apis).
	hack/update-codegen.sh

demo: ## The main job on an embedded control plane: a GPU cluster, the scheduler, a TensorFlow job.
	go run -ldflags "$(LDFLAGS)" ./cmd/muster-sim demo

# The planner alone (BenchmarkCompute) and the whole plan in PreFilter with the
# profile's filters (BenchmarkPlanGang) beside its filter check alone for
# the same gang (BenchmarkFilterCheck), median of 6 each.
PLANNER_BENCH = go test -run '^$$' -bench 'BenchmarkCompute|BenchmarkPlanGang|BenchmarkFilterCheck' -benchmem -count 6 ./pkg/gang/ ./pkg/plugins/mustergang/ | tee bench/results/planner.txt

bench: ## Planner benchmarks, then the simulator set: every equal-work burst and stream (gangs of 2/8/64 at 1000/5000/15000 nodes) over 5 seeds, contended scenarios over 3, the soaks (a month at 2000 nodes, four contended days at 500), a profile (writes bench/results, updates BENCHMARKS.md; about two and a half hours on 2 cores).
	mkdir -p bench/results
	$(PLANNER_BENCH)
	hack/bench.sh

.PHONY: bench-full
bench-full: bench-api ## The real-API-server burst, then make bench's set with native gang + TAS on every equal-work scenario, plus large: several hours.
	mkdir -p bench/results
	$(PLANNER_BENCH)
	FULL=1 hack/bench.sh

API_BENCH_RUNS ?= 7
bench-api: ## muster and a stock kube-scheduler binding a burst of gangs, created at once or waiting before the scheduler starts, through the in-process API server; median of 7 rounds (bench/results/apiserver.txt; ~10 min).
	mkdir -p bench/results
	go test -run '^$$' -bench BenchmarkAPIServerBurst -benchtime 1x -timeout 30m ./test/integration/ -args -api-bench-runs=$(API_BENCH_RUNS) 2>/dev/null \
		| grep -E '^(Benchmark|goos|goarch|cpu|pkg)' > bench/results/apiserver.txt
	cat bench/results/apiserver.txt

# Upstream's scheduler benchmark (k8s.io/kubernetes/test/integration/scheduler_perf
# at the pinned version, real kube-apiserver and etcd in process) run for the
# default profile and muster side by side: test/perf (build tag perf, so CI never
# compiles it). PERF_WORKLOADS are <config dir>/<test case>/<workload> of
# upstream's configs; the default set is the 5000-node sizes that fit 2 cores
# and 24 GiB (plain pods, gangs, topology, anti-affinity) and upstream's DRA
# cases for extended resources and PodGroup-level claims (about 30 minutes a
# run on 2 cores). PERF_GO_WRAP prefixes the build (e.g. a flock on a shared
# machine).
PERF_RUNS ?= 3
PERF_SCHEDULERS ?= default,muster
PERF_WORKLOADS ?= misc/SchedulingBasic/5000Nodes,podgroup/gangscheduling/GangScheduling/5000Nodes_1000Gangs_3000Pods,podgroup/basicscheduling/BasicScheduling/5000Nodes_1000Groups_3000Pods,podgroup/tas/TopologyAwareScheduling/5000Nodes_750Gangs_3000Pods,\
affinity/SchedulingPodAntiAffinity/5000Nodes_2000Pods,dra/extendedresource/ExtendedResource/Explicit_25classes_5000pods_500nodes,\
dra/workloadresourceclaims/SharedPodGroupResourceClaimTemplate/100podgroups_5000pods
PERF_GO_WRAP ?=
# PERF_FEATURE_GATES are set for every scheduler alike, over the gates muster
# changes for the framework's own plugins, which both run with
# (InterPodAffinityHostnameFastPath=true); e.g. ...=false to compare without.
PERF_FEATURE_GATES ?=
PERF_OUT ?= bench/results/perf
.PHONY: bench-perf
bench-perf: ## upstream's scheduler_perf workloads for the default profile (native gangs) and muster, PERF_RUNS interleaved runs (etcd built once into ~/.cache/muster-perf); DataItems JSON and table.md in bench/results/perf.
	etcd_dir=$$(hack/build-etcd.sh) && \
	$(PERF_GO_WRAP) go test -tags perf -c -o bin/perf.test ./test/perf/ && \
	rm -rf $(PERF_OUT) && mkdir -p $(PERF_OUT) out && \
	PATH="$$etcd_dir:$$PATH" bin/perf.test -test.run '^$$' -test.bench '^BenchmarkPerf$$' -test.benchtime 1x -test.timeout 6h \
		-perf-runs=$(PERF_RUNS) -perf-schedulers=$(PERF_SCHEDULERS) -perf-workloads=$(PERF_WORKLOADS) -perf-feature-gates=$(PERF_FEATURE_GATES) \
		-data-items-dir=$(abspath $(PERF_OUT)) -perf-info-file=$(abspath $(PERF_OUT))/run-info.json >out/bench-perf.log 2>&1; \
	rc=$$?; grep -E '^(Benchmark|--- (FAIL|SKIP)|FAIL|PASS|ok|peak RSS|placement|goos|goarch|cpu)' out/bench-perf.log > $(PERF_OUT)/bench.txt; \
	cat $(PERF_OUT)/bench.txt | grep -v '^Benchmark'; test $$rc = 0 || { echo "bench-perf failed: see out/bench-perf.log" >&2; exit $$rc; }
	go run -tags perf ./test/perf/table $(PERF_OUT) | tee $(PERF_OUT)/table.md

clean: ## Remove build output.
	rm -rf bin/
