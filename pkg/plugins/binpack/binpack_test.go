package binpack

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
)

const gpu v1.ResourceName = "nvidia.com/gpu"

func node(name string, gpus int64) *v1.Node {
	alloc := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("256Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
	if gpus > 0 {
		alloc[gpu] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: alloc, Capacity: alloc}}
}

func pod(name, nodeName, cpu string, gpus int64) *v1.Pod {
	req := v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse("4Gi")}
	if gpus > 0 {
		req[gpu] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{NodeName: nodeName, Containers: []v1.Container{{Name: "c",
			Resources: v1.ResourceRequirements{Requests: req, Limits: req}}}},
	}
}

// newHandle is a framework over nodes and their pods with the DRA manager
// kube-scheduler gives NodeResourcesFit when DRAExtendedResource is on.
func newHandle(t *testing.T, nodes []*v1.Node, pods []*v1.Pod) fwk.Handle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	claims := assumecache.NewAssumeCache(klog.FromContext(ctx), factory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
	slices, err := tracker.StartTracker(ctx, tracker.Options{SliceInformer: factory.Resource().V1().ResourceSlices(), KubeClient: client})
	if err != nil {
		t.Fatal(err)
	}
	manager := dynamicresources.NewDRAManager(ctx, claims, slices, factory)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	h, err := frameworkruntime.NewFramework(ctx, nil, nil,
		frameworkruntime.WithSnapshotSharedLister(cache.NewSnapshot(pods, nodes)),
		frameworkruntime.WithSharedDRAManager(manager),
		frameworkruntime.WithInformerFactory(factory))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// scores runs pl's PreScore and Score for p on every node, by node name.
func scores(t *testing.T, pl fwk.ScorePlugin, h fwk.Handle, p *v1.Pod) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	infos, err := h.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		t.Fatal(err)
	}
	cs := framework.NewCycleState()
	if st := pl.(fwk.PreScorePlugin).PreScore(ctx, cs, p, infos); !st.IsSuccess() {
		t.Fatalf("%s PreScore: %v", pl.Name(), st)
	}
	out := map[string]int64{}
	for _, ni := range infos {
		s, st := pl.Score(ctx, cs, p, ni)
		if !st.IsSuccess() {
			t.Fatalf("%s Score on %s: %v", pl.Name(), ni.Node().Name, st)
		}
		out[ni.Node().Name] = s
	}
	return out
}

// MusterBinPack gives every pod, with or without GPUs, the score
// NodeResourcesFit gives it with the same strategy, and scores a pod
// without GPUs by the native resources alone.
func TestScoresAsNodeResourcesFitDoes(t *testing.T) {
	nodes := []*v1.Node{node("gpu-empty", 8), node("gpu-half", 8), node("gpu-full", 8), node("cpu-only", 0)}
	existing := []*v1.Pod{
		pod("half", "gpu-half", "30", 4),
		pod("full", "gpu-full", "8", 7),
		pod("busy", "cpu-only", "40", 0),
	}
	h := newHandle(t, nodes, existing)
	ctx := context.Background()
	strategy := DefaultStrategy()
	fit, err := noderesources.NewFit(ctx, &config.NodeResourcesFitArgs{ScoringStrategy: strategy}, h,
		plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := New(ctx, nil, h)
	if err != nil {
		t.Fatal(err)
	}
	b := pl.(*BinPack)
	for _, p := range []*v1.Pod{pod("plain", "", "2", 0), pod("one-gpu", "", "2", 1), pod("four-gpus", "", "16", 4)} {
		want := scores(t, fit.(fwk.ScorePlugin), h, p)
		got := scores(t, b, h, p)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("pod %s: MusterBinPack scores %v, NodeResourcesFit %v", p.Name, got, want)
		}
		if usesNative := b.scorer(p) == b.native; usesNative != (p.Name == "plain") {
			t.Errorf("pod %s: scored by the native-only scorer %v", p.Name, usesNative)
		}
	}
	// The scores rank something: GPU pods pack onto the fullest node that
	// still fits them, which a test of equal scores alone would not show.
	if got := scores(t, b, h, pod("one-gpu", "", "2", 1)); !(got["gpu-full"] > got["gpu-half"] && got["gpu-half"] > got["gpu-empty"]) {
		t.Errorf("one-GPU pod scores %v: want gpu-full > gpu-half > gpu-empty", got)
	}
}

func TestArgs(t *testing.T) {
	h := newHandle(t, nil, nil)
	ctx := context.Background()
	raw := func(s string) runtime.Object {
		return &runtime.Unknown{Raw: []byte(s), ContentType: runtime.ContentTypeJSON}
	}
	for _, tc := range []struct {
		name, args string
		wantErr    bool
		extended   int
	}{
		{name: "none: the shipped weights", extended: 1},
		{name: "scoringStrategy", args: `{"scoringStrategy":{"type":"MostAllocated","resources":[{"name":"cpu","weight":1},{"name":"example.com/tpu","weight":3}]}}`, extended: 1},
		{name: "only native resources", args: `{"scoringStrategy":{"type":"LeastAllocated","resources":[{"name":"cpu","weight":1}]}}`},
		{name: "unknown field", args: `{"scoringStrategy":{"type":"MostAllocated"},"weights":{}}`, wantErr: true},
		{name: "ignoredResources", args: `{"ignoredResources":["example.com/x"]}`, wantErr: true},
		{name: "unknown strategy", args: `{"scoringStrategy":{"type":"Tightest","resources":[{"name":"cpu","weight":1}]}}`, wantErr: true},
		{name: "weight out of range", args: `{"scoringStrategy":{"type":"MostAllocated","resources":[{"name":"cpu","weight":500}]}}`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obj runtime.Object
			if tc.args != "" {
				obj = raw(tc.args)
			}
			pl, err := New(ctx, obj, h)
			if (err != nil) != tc.wantErr {
				t.Fatalf("New: %v, want an error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			b := pl.(*BinPack)
			if len(b.extended) != tc.extended || (b.native == nil) != (tc.extended == 0) {
				t.Errorf("extended %v, native scorer %v", b.extended, b.native != nil)
			}
		})
	}
}
