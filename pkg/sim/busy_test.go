package sim

import (
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// busyNoisy is one rack of 8 nodes: the background fills 4 nodes with
// 8-GPU pods and leaves 4 free, 2 of which run a noisy pod. The gang of two
// 8-GPU workers fits only on the other 2; on a noisy node it would fit too
// but for its anti-affinity (8 + 0.75 + 48 CPUs of 64), and MostAllocated
// scoring (muster's) would rather take the noisy nodes, whose CPU is
// busier.
const busyNoisy = `
name: busy-noisy
cluster: {nodes: 8, gpusPerNode: 8, nodesPerRack: 8}
background:
  pods: {}
  gpuPods: {fraction: 0.5, freeNodes: 0.5, sizes: {8: 1}}
  noisyPods: {fraction: 0.5}
workload:
  antiAffinity: {noisyPods: true}
  waves: [{duration: 1m, gangs: ["2x8"]}]
`

// busyApart is 4 empty nodes and two gangs of two 1-GPU workers that may
// not share a node with another job's pods: muster packs a gang onto one
// node, and without the anti-affinity both onto the same one.
const busyApart = `
name: busy-apart
cluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4}
workload:
  antiAffinity: {otherGangs: true}
  waves: [{duration: 1m, gangs: ["2*2x1"]}]
`

// Before the first step the scheduler's cache counts the GPU pods' GPUs,
// CPU and memory on their nodes, and the noisy pods carry the label the
// workers avoid.
func TestBusyBackgroundIsInTheSchedulersCache(t *testing.T) {
	plan := parsePlan(t, busyNoisy, 1)
	h := startHarness(t, plan, Default)
	dump := h.driver.sched.Cache.Dump()
	gpus, noisy := map[string]int64{}, map[string]bool{}
	for _, bp := range plan.Background {
		gpus[bp.Node] += bp.GPUs
		noisy[bp.Node] = noisy[bp.Node] || bp.Noisy
	}
	for _, n := range plan.Nodes {
		info := dump.Nodes[n.Name]
		if info == nil {
			t.Fatalf("node %s not in the cache", n.Name)
		}
		req := info.Requested
		// 3 pods of the pods block (250m each), 4 CPUs per background GPU,
		// 8 CPUs for a noisy pod.
		wantCPU := 750 + 4000*gpus[n.Name]
		if noisy[n.Name] {
			wantCPU += 8000
		}
		if got := req.ScalarResources[configv1.DefaultGPUResourceName]; got != gpus[n.Name] || req.MilliCPU != wantCPU {
			t.Errorf("node %s: cache has %d GPUs and %dm CPU requested; the plan has %d GPUs, %dm", n.Name, got, req.MilliCPU, gpus[n.Name], wantCPU)
		}
		labelled := false
		for _, pi := range info.GetPods() {
			labelled = labelled || pi.GetPod().Labels["app"] == scenario.NoisyApp
		}
		if labelled != noisy[n.Name] {
			t.Errorf("node %s: a pod labelled app=%s is there: %v, want %v", n.Name, scenario.NoisyApp, labelled, noisy[n.Name])
		}
	}
	if free, nNoisy := plan.FreeNodes(); free != 4 || nNoisy != 2 || h.cluster.bg.gpus != 32 {
		t.Errorf("%d free nodes, %d noisy, %d GPUs held; want 4, 2, 32", free, nNoisy, h.cluster.bg.gpus)
	}
}

// Every scheduler, the harness's own first fit (None) too, binds the gangs
// whole where their anti-affinity allows: never beside a noisy pod, never
// beside another job's pod, never where background pods hold GPUs.
func TestWorkersKeepTheirAntiAffinity(t *testing.T) {
	for _, tc := range []struct {
		name, text string
	}{{"noisy", busyNoisy}, {"apart", busyApart}} {
		plan := parsePlan(t, tc.text, 1)
		busy := map[string]string{}
		for _, bp := range plan.Background {
			switch {
			case bp.Noisy:
				busy[bp.Node] = "a noisy pod"
			case bp.GPUs > 0:
				busy[bp.Node] = "background GPU pods"
			}
		}
		path := filepath.Join(t.TempDir(), "busy.yaml")
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		runs := map[string]*measure.Run{Muster: run(t, plan, Muster), Default: run(t, plan, Default), None: run(t, plan, None),
			NativeGang: runInChild(t, path, NativeGang, 1)}
		for name, r := range runs {
			if r.Metrics.GangsCompleted != len(plan.Jobs) || r.Metrics.PartialGangs != 0 {
				t.Errorf("%s, %s: %d of %d gangs completed, %d partial (%s)", tc.name, name, r.Metrics.GangsCompleted, len(plan.Jobs),
					r.Metrics.PartialGangs, r.Details.EndReason)
			}
			gangOn := map[string]string{}
			for _, g := range r.Gangs {
				for _, node := range g.Nodes {
					if why := busy[node]; why != "" {
						t.Errorf("%s, %s: gang %s has a worker on %s, which runs %s", tc.name, name, g.Name, node, why)
					}
					if other := gangOn[node]; other != "" && other != g.Name {
						t.Errorf("%s, %s: gangs %s and %s share node %s", tc.name, name, other, g.Name, node)
					}
					gangOn[node] = g.Name
				}
			}
		}
	}
}

// The workers' anti-affinity is on every scheduler's pods, their CPU-only
// members have none, and without the workload's block a pod has none.
func TestWorkerAntiAffinityTerms(t *testing.T) {
	plan := parsePlan(t, busyNoisy, 1)
	j := &plan.Jobs[0]
	job := jobObject(j, "muster", 0)
	anti := &scenario.AntiAffinity{OtherGangs: true, NoisyPods: true}
	for _, b := range []*built{{schedulerName: "muster"}, {schedulerName: v1.DefaultSchedulerName}} {
		pod := podObject(j, job, b, 0, 0, 0, nil, anti)
		terms := pod.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		if len(terms) != 2 || terms[0].TopologyKey != configv1.LabelHostname || terms[1].Namespaces[0] != backgroundNamespace ||
			terms[1].LabelSelector.MatchLabels["app"] != scenario.NoisyApp {
			t.Errorf("%s: anti-affinity terms %+v", b.schedulerName, terms)
		}
		if (pod.Spec.Affinity.NodeAffinity != nil) != (b.schedulerName == v1.DefaultSchedulerName) {
			t.Errorf("%s: node affinity %+v; only the default scheduler's pods carry the spot policy", b.schedulerName, pod.Spec.Affinity.NodeAffinity)
		}
		if none := podObject(j, job, b, 0, 0, 0, nil, nil); none.Spec.Affinity != nil && none.Spec.Affinity.PodAntiAffinity != nil {
			t.Errorf("%s: anti-affinity without workload.antiAffinity", b.schedulerName)
		}
	}
	ps := *j
	ps.CPUMembers = 1
	if pod := podObject(&ps, job, &built{schedulerName: "muster"}, 0, ps.Workers, 0, nil, anti); pod.Spec.Affinity != nil {
		t.Errorf("a CPU-only member has affinity %+v", pod.Spec.Affinity)
	}
}
