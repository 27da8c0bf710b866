package mustergang

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/config"
	"github.com/muster-sched/muster/pkg/gang"
)

// newDRAManager is the framework's DRA manager over factory, wired as
// kube-scheduler wires it (the extended-resource cache fed by the
// DeviceClass informer).
func newDRAManager(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) (fwk.SharedDRAManager, error) {
	logger := klog.FromContext(ctx)
	claims := assumecache.NewAssumeCache(logger, factory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
	tracker, err := resourceslicetracker.StartTracker(ctx, resourceslicetracker.Options{
		SliceInformer: factory.Resource().V1().ResourceSlices(), KubeClient: client})
	if err != nil {
		return nil, err
	}
	manager := dynamicresources.NewDRAManager(ctx, claims, tracker, factory)
	if erCache, ok := manager.DeviceClassResolver().(*extendedresourcecache.ExtendedResourceCache); ok && erCache != nil {
		if _, err := factory.Resource().V1().DeviceClasses().Informer().AddEventHandler(erCache); err != nil {
			return nil, err
		}
	}
	return manager, nil
}

// waitForDRA waits until the DRA manager's caches (filled by informer
// handlers after the informers synced) hold the claims and slices among
// objects, and the devices and shares of the allocated claims (a handler of its own).
func waitForDRA(t testing.TB, manager fwk.SharedDRAManager, objects []runtime.Object) {
	t.Helper()
	var claims, slices, allocated, shares int
	var extended []v1.ResourceName
	for _, o := range objects {
		switch o := o.(type) {
		case *resourceapi.ResourceClaim:
			claims++
			if o.Status.Allocation != nil {
				for _, r := range o.Status.Allocation.Devices.Results {
					if r.ShareID != nil {
						shares++
					} else {
						allocated++
					}
				}
			}
		case *resourceapi.ResourceSlice:
			slices++
		case *resourceapi.DeviceClass:
			if o.Spec.ExtendedResourceName != nil {
				extended = append(extended, v1.ResourceName(*o.Spec.ExtendedResourceName))
			}
		}
	}
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		c, err := manager.ResourceClaims().List()
		if err != nil {
			return false, err
		}
		s, err := manager.ResourceSlices().ListWithDeviceTaintRules()
		for _, name := range extended {
			if manager.DeviceClassResolver().GetDeviceClass(name) == nil {
				return false, err
			}
		}
		if err != nil {
			return false, err
		}
		state, err := manager.ResourceClaims().GatherAllocatedState()
		if err != nil || state == nil {
			return false, nil // a concurrent modification, as the plugin's snapshot retries it
		}
		return len(c) == claims && len(s) == slices && len(state.AllocatedDevices) == allocated &&
			len(state.AllocatedSharedDeviceIDs) == shares, nil
	})
	if err != nil {
		t.Fatalf("DRA manager caches: %v", err)
	}
}

const gpuClassName = "gpu.nvidia.com"

// gpuClass serves nvidia.com/gpu requests from the devices of driver
// gpu.nvidia.com, as NVIDIA's DRA driver publishes them.
func gpuClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: gpuClassName},
		Spec: resourceapi.DeviceClassSpec{
			ExtendedResourceName: ptr.To("nvidia.com/gpu"),
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.nvidia.com"`}}},
		}}
}

// gpuSlice publishes node's GPUs: one device per model given.
func gpuSlice(node string, models ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpus"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpuClassName, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i, m := range models {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"model": {StringValue: ptr.To(m)}}})
	}
	return s
}

// draNode is a node without nvidia.com/gpu in allocatable: its GPUs, if
// any, come from a ResourceSlice.
func draNode(name, rack string) *v1.Node { return testobj.MakeNode(name).Rack(rack).Obj() }

// claimWorker is member i of Job j with a ResourceClaim of its own for
// one GPU device, of model when model is set.
func claimWorker(i int, model string) (*v1.Pod, *resourceapi.ResourceClaim) {
	pod := worker("j", i, 0, "")
	pod.Spec.Affinity = nil
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: pod.Name + "-gpu", UID: types.UID(pod.Name + "-gpu")},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
	if model != "" {
		claim.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["gpu.nvidia.com"].model == %q`, model)}}}
	}
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	return pod, claim
}

func draObjects(slices ...*resourceapi.ResourceSlice) []runtime.Object {
	objs := []runtime.Object{gpuClass()}
	for _, s := range slices {
		objs = append(objs, s)
	}
	return objs
}

func slotsByNode(plan *gang.ActivePlan) map[string]int {
	out := map[string]int{}
	for _, node := range plan.Slots {
		out[node]++
	}
	return out
}

func TestDRAExtendedResourceGPUsArePlanned(t *testing.T) {
	// Four 8-GPU workers (plain nvidia.com/gpu requests) on nodes whose
	// GPUs are DRA devices of a class with extendedResourceName
	// nvidia.com/gpu: with three such nodes there is no plan, with four
	// one worker per node.
	workers := func() []*v1.Pod {
		pods := make([]*v1.Pod, 4)
		for i := range pods {
			pods[i] = worker("j", i, 8, "")
			pods[i].Spec.Affinity = nil
		}
		return pods
	}
	eight := []string{"a100", "a100", "a100", "a100", "a100", "a100", "a100", "a100"}

	t.Run("three nodes", func(t *testing.T) {
		nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1"), draNode("n3", "r1")}
		pods := workers()
		f := newTestFrameworkWith(t, 4, nodes, pods, draObjects(gpuSlice("n1", eight...), gpuSlice("n2", eight...), gpuSlice("n3", eight...))...)
		_, status := f.preFilter(t, pods[0])
		require.False(t, status.IsSuccess())
		assert.Contains(t, status.Message(), "nvidia.com/gpu")
		key, _ := gang.KeyOf(pods[0])
		assert.Nil(t, f.plugin.gangs.Plan(key), "no plan, nothing held")
	})
	t.Run("four nodes", func(t *testing.T) {
		nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1"), draNode("n3", "r1"), draNode("n4", "r1")}
		pods := workers()
		f := newTestFrameworkWith(t, 4, nodes, pods, draObjects(gpuSlice("n1", eight...), gpuSlice("n2", eight...), gpuSlice("n3", eight...), gpuSlice("n4", eight...))...)
		_, status := f.preFilter(t, pods[0])
		require.True(t, status.IsSuccess(), status.Message())
		key, _ := gang.KeyOf(pods[0])
		assert.Equal(t, map[string]int{"n1": 1, "n2": 1, "n3": 1, "n4": 1}, slotsByNode(f.plugin.gangs.Plan(key)))
	})
}

// An extended resource other than the GPU that a DeviceClass serves (an
// RDMA NIC of a DRA driver) is in no node's allocatable: muster leaves it to
// the filters (DynamicResources allocates it), as NodeResourcesFit does,
// instead of finding no node with room for it.
func TestDRAOtherExtendedResourcesAreLeftToTheFilters(t *testing.T) {
	rdma := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "rdma.example.com"},
		Spec: resourceapi.DeviceClassSpec{
			ExtendedResourceName: ptr.To("example.com/rdma"),
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "rdma.example.com"`}}},
		}}
	nic := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-nics"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "rdma.example.com", NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "nic-0"}}}}
	}
	nodes := []*v1.Node{testobj.MakeNode("n1").GPUs(8).Rack("r1").Obj(), testobj.MakeNode("n2").GPUs(8).Rack("r1").Obj()}
	pods := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	for _, pod := range pods {
		res := &pod.Spec.Containers[0].Resources
		res.Requests["example.com/rdma"] = resource.MustParse("1")
		if res.Limits == nil {
			res.Limits = v1.ResourceList{}
		}
		res.Limits["example.com/rdma"] = resource.MustParse("1")
	}
	// Priority-0 CPU pods run on both nodes, as on a real cluster.
	background := append(cpuPods("n1", 5), cpuPods("n2", 5)...)
	f := newTestFrameworkWith(t, 2, nodes, append(pods, background...), append(draObjects(), rdma, nic("n1"), nic("n2"))...)
	_, status := f.preFilter(t, pods[0])
	require.True(t, status.IsSuccess(), status.Message())
	key, _ := gang.KeyOf(pods[0])
	assert.Equal(t, map[string]int{"n1": 1, "n2": 1}, slotsByNode(f.plugin.gangs.Plan(key)), "one NIC per node: one member each")
}

func TestDRAMixedNodesAreOnePool(t *testing.T) {
	// One DRA node and one device-plugin node of 8 GPUs each: a gang of
	// two 8-GPU workers spans both.
	nodes := []*v1.Node{draNode("dra", "r1"), testobj.MakeNode("dp").GPUs(8).Rack("r1").Obj()}
	pods := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	f := newTestFrameworkWith(t, 2, nodes, pods, draObjects(gpuSlice("dra", "a", "a", "a", "a", "a", "a", "a", "a"))...)
	_, status := f.preFilter(t, pods[0])
	require.True(t, status.IsSuccess(), status.Message())
	key, _ := gang.KeyOf(pods[0])
	assert.Equal(t, map[string]int{"dra": 1, "dp": 1}, slotsByNode(f.plugin.gangs.Plan(key)))
}

func TestDRAClaimsPerWorker(t *testing.T) {
	// Workers with a one-device ResourceClaim each: their GPUs are their
	// claims' devices, so four of them need four devices.
	setup := func(t *testing.T, slices ...*resourceapi.ResourceSlice) (*testFramework, []*v1.Pod) {
		var nodes []*v1.Node
		for _, s := range slices {
			nodes = append(nodes, draNode(*s.Spec.NodeName, "r1"))
		}
		var pods []*v1.Pod
		objs := draObjects(slices...)
		for i := range 4 {
			pod, claim := claimWorker(i, "")
			pods = append(pods, pod)
			objs = append(objs, claim)
		}
		return newTestFrameworkWith(t, 4, nodes, pods, objs...), pods
	}
	t.Run("three devices", func(t *testing.T) {
		f, pods := setup(t, gpuSlice("n1", "a"), gpuSlice("n2", "a"), gpuSlice("n3", "a"))
		_, status := f.preFilter(t, pods[0])
		require.False(t, status.IsSuccess(), "four one-device claims on three devices")
		key, _ := gang.KeyOf(pods[0])
		assert.Nil(t, f.plugin.gangs.Plan(key))
	})
	t.Run("four devices", func(t *testing.T) {
		f, pods := setup(t, gpuSlice("n1", "a"), gpuSlice("n2", "a"), gpuSlice("n3", "a"), gpuSlice("n4", "a"))
		_, status := f.preFilter(t, pods[0])
		require.True(t, status.IsSuccess(), status.Message())
		key, _ := gang.KeyOf(pods[0])
		assert.Equal(t, map[string]int{"n1": 1, "n2": 1, "n3": 1, "n4": 1}, slotsByNode(f.plugin.gangs.Plan(key)))
	})
}

func TestDRATrialSeesEarlierMembersDevices(t *testing.T) {
	// n1 has two GPUs but only one a100; n2 has one a100. Two workers each
	// claim an a100: by count n1 holds both, but the DynamicResources
	// Filter of the second would still see n1's a100 free. The plan's
	// per-trial view gives it to the first worker, so the second goes to
	// n2: the plan the cycles will allocate.
	nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}
	objs := draObjects(gpuSlice("n1", "a100", "h100"), gpuSlice("n2", "a100"))
	var pods []*v1.Pod
	for i := range 2 {
		pod, claim := claimWorker(i, "a100")
		pods = append(pods, pod)
		objs = append(objs, claim)
	}
	f := newTestFrameworkWith(t, 2, nodes, pods, objs...)
	_, status := f.preFilter(t, pods[0])
	require.True(t, status.IsSuccess(), status.Message())
	key, _ := gang.KeyOf(pods[0])
	assert.Equal(t, map[string]int{"n1": 1, "n2": 1}, slotsByNode(f.plugin.gangs.Plan(key)))
}

func TestDRAClaimAskingForMoreThanAnyNodeHas(t *testing.T) {
	// One worker's claim asks for 4 devices; no node has more than 2: no
	// plan, and the message counts the claim's devices as the member's GPUs.
	nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}
	objs := draObjects(gpuSlice("n1", "a", "a"), gpuSlice("n2", "a", "a"))
	pod, claim := claimWorker(0, "")
	claim.Spec.Devices.Requests[0].Exactly.Count = 4
	objs = append(objs, claim)
	f := newTestFrameworkWith(t, 1, nodes, []*v1.Pod{pod}, objs...)
	_, status := f.preFilter(t, pod)
	require.False(t, status.IsSuccess())
	assert.Contains(t, status.Message(), "needs 1 members of 4 nvidia.com/gpu; none fit; 2 eligible nodes have 4 free nvidia.com/gpu")
}

func TestNodeGPUs(t *testing.T) {
	gpu := v1.ResourceName("nvidia.com/gpu")
	for _, tc := range []struct {
		name        string
		allocatable int64
		free        int64 // allocatable minus requested
		draFree     int64
		want        int64
	}{
		{"device plugin only", 8, 3, 0, 3},
		{"DRA only, requests served by DRA", 0, -16, 8, 8},
		{"DRA only, all allocated", 0, -16, 0, 0},
		{"both on one node", 8, 2, 4, 6},
		{"no GPUs", 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testobj.MakeNode("n").Obj()
			if tc.allocatable > 0 {
				node = testobj.MakeNode("n").GPUs(tc.allocatable).Obj()
			}
			ni := framework.NewNodeInfo()
			ni.SetNode(node)
			free := gang.Resources{Scalars: map[v1.ResourceName]int64{gpu: tc.free}}
			nodeGPUs(&free, ni, gpu, tc.draFree)
			assert.Equal(t, tc.want, free.Scalars[gpu])
		})
	}
}

func TestDRATopologyFromDeviceAttribute(t *testing.T) {
	// The "clique" level takes a node's domain from its GPUs' clique
	// attribute. Clique A (n1, n4) has 8 + 4 free GPUs, clique B (n2, n3)
	// 16: a gang of two 8-GPU workers that requires one clique lands in B.
	args := defaultArgs(t)
	args.TopologyLevels = append([]config.TopologyLevel{{Name: "node", NodeLabel: "kubernetes.io/hostname"},
		{Name: "clique", DeviceAttribute: "gpu.nvidia.com/clique"}}, args.TopologyLevels[1:]...)
	withClique := func(s *resourceapi.ResourceSlice, clique string) *resourceapi.ResourceSlice {
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].Attributes["clique"] = resourceapi.DeviceAttribute{StringValue: ptr.To(clique)}
		}
		return s
	}
	eight := []string{"a", "a", "a", "a", "a", "a", "a", "a"}
	nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1"), draNode("n3", "r1"), draNode("n4", "r1")}
	objs := append(draObjects(withClique(gpuSlice("n1", eight...), "A"), withClique(gpuSlice("n2", eight...), "B"),
		withClique(gpuSlice("n3", eight...), "B"), withClique(gpuSlice("n4", "a", "a", "a", "a"), "A")), args)
	pods := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	for _, p := range pods {
		p.Annotations = map[string]string{gang.AnnotationTopologyRequired: "clique"}
	}
	f := newTestFrameworkWith(t, 2, nodes, pods, objs...)
	_, status := f.preFilter(t, pods[0])
	require.True(t, status.IsSuccess(), status.Message())
	key, _ := gang.KeyOf(pods[0])
	plan := f.plugin.gangs.Plan(key)
	assert.Equal(t, map[string]int{"n2": 1, "n3": 1}, slotsByNode(plan))
	assert.Equal(t, "B", plan.Domain)
}

// allocatedExtendedClaim is the claim the DynamicResources plugin made for
// pod's nvidia.com/gpu on node: all of its devices, reserved for pod.
func allocatedExtendedClaim(pod *v1.Pod, node string, devices int) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name + "-extended-resources", UID: types.UID(pod.Name + "-claim"),
			Annotations:     map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "container-0-request-0",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(devices)}}}}},
		Status: resourceapi.ResourceClaimStatus{ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}},
	}
	alloc := &resourceapi.AllocationResult{}
	for i := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "container-0-request-0", Driver: gpuClassName, Pool: node, Device: fmt.Sprintf("gpu-%d", i)})
	}
	claim.Status.Allocation = alloc
	pod.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{ResourceClaimName: claim.Name}
	return claim
}

func TestDRAPreemptionFreesVictimsDevices(t *testing.T) {
	// A low-priority 2x8 gang holds every DRA GPU of n1 and n2. The
	// DynamicResources plugin cannot see a victim's devices freed (it has
	// no PreFilterExtensions); muster's per-trial view does, so the
	// high-priority 2x8 gang evicts the low gang whole.
	eight := []string{"a", "a", "a", "a", "a", "a", "a", "a"}
	low := lowGang("low", "n1", "n2")
	objs := draObjects(gpuSlice("n1", eight...), gpuSlice("n2", eight...))
	for i, p := range low {
		objs = append(objs, allocatedExtendedClaim(p, []string{"n1", "n2"}[i], 8))
	}
	high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	for _, p := range high {
		p.Spec.Priority = ptr.To[int32](100)
	}
	f := newTestFrameworkWith(t, 2, []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}, append(low, high...), objs...)
	plan := f.preemptFor(t, high[0])
	require.NotNil(t, plan, "no preemption")
	assert.Equal(t, []string{"low-0", "low-1"}, sets.List(victimNames(plan, low)))
	assert.Equal(t, map[string]int{"n1": 1, "n2": 1}, slotsByNode(plan))
}

// sharedVictimClaim is one claim of devices GPUs allocated on node and
// reserved for every pod in pods, each of which references it.
func sharedVictimClaim(node string, devices int, pods ...*v1.Pod) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shared-gpus", UID: "shared-gpus"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(devices)}}}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}}}
	for i := range devices {
		claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: gpuClassName, Pool: node, Device: fmt.Sprintf("gpu-%d", i)})
	}
	for _, pod := range pods {
		pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
		pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
	}
	return claim
}

// sharedClaimCase: the two members of a low-priority gang on n1 share one
// claim of n1's four devices (with a pod of another Job, of the preemptor's
// priority, when outside), and a high-priority 2x2 gang, whose members may
// share a node, asks for GPUs.
func sharedClaimCase(t *testing.T, outside bool) (f *testFramework, low, high []*v1.Pod) {
	low = []*v1.Pod{worker("low", 0, 0, "n1"), worker("low", 1, 0, "n1")}
	high = []*v1.Pod{worker("j", 0, 2, ""), worker("j", 1, 2, "")}
	consumers := slices.Clone(low)
	if outside {
		consumers = append(consumers, worker("other", 0, 0, "n1"))
	}
	for _, p := range consumers {
		p.Spec.Priority = ptr.To[int32](1)
	}
	for _, p := range append(high, consumers[len(low):]...) {
		p.Spec.Priority = ptr.To[int32](100)
	}
	for _, p := range high {
		p.Spec.Affinity = nil // both on n1
	}
	claim := sharedVictimClaim("n1", 4, consumers...)
	f = newTestFrameworkWith(t, 2, []*v1.Node{draNode("n1", "r1")}, append(consumers, high...),
		append(draObjects(gpuSlice("n1", "a", "a", "a", "a")), claim)...)
	return f, low, high
}

func TestDRAVictimGangFreesTheClaimItsMembersShare(t *testing.T) {
	// Evicting the low gang frees the claim's four devices, once: the high
	// gang preempts it. Evicting one member alone would free nothing.
	f, low, high := sharedClaimCase(t, false)
	plan := f.preemptFor(t, high[0])
	require.NotNil(t, plan, "no preemption: the shared claim was counted for no victim")
	assert.Equal(t, []string{"low-0", "low-1"}, sets.List(victimNames(plan, low)))
	assert.Equal(t, map[string]int{"n1": 2}, slotsByNode(plan))
}

func TestDRAVictimClaimSharedOutsideTheGangFreesNothing(t *testing.T) {
	// The claim also serves a pod the high gang may not evict (its
	// priority is equal): evicting the low gang frees none of the devices,
	// so there is no preemption.
	f, low, high := sharedClaimCase(t, true)
	nodes, err := f.fw.SnapshotSharedLister().NodeInfos().List()
	require.NoError(t, err)
	unit := f.plugin.victimClaims(nodes)(gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "low"})
	for _, p := range low {
		assert.Zero(t, f.plugin.dra.request(gang.Resources{}, p, unit).Scalars["nvidia.com/gpu"], "GPUs %s frees", p.Name)
	}
	assert.Nil(t, f.preemptFor(t, high[0]), "a plan evicting pods whose claim stays reserved")
}

func TestDRAClassThatDoesNotExist(t *testing.T) {
	// A worker's claim names a DeviceClass nobody created: no plan, and
	// the message says which class.
	nodes := []*v1.Node{draNode("n1", "r1")}
	pod, claim := claimWorker(0, "")
	claim.Spec.Devices.Requests[0].Exactly.DeviceClassName = "gpu.example.com"
	f := newTestFrameworkWith(t, 1, nodes, []*v1.Pod{pod}, append(draObjects(gpuSlice("n1", "a")), claim)...)
	_, status := f.preFilter(t, pod)
	require.False(t, status.IsSuccess())
	assert.Contains(t, status.Message(), "device class gpu.example.com does not exist")
}

func TestDRAClassChangedWhileGangWaits(t *testing.T) {
	// The GPU class's selector changes so it no longer selects the nodes'
	// devices: the next plan counts no DRA GPU there; changed back, the
	// gang is planned.
	eight := []string{"a", "a", "a", "a", "a", "a", "a", "a"}
	pods := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	f := newTestFrameworkWith(t, 2, []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}, pods,
		draObjects(gpuSlice("n1", eight...), gpuSlice("n2", eight...))...)
	setSelector := func(expr string) {
		t.Helper()
		ctx := context.Background()
		class, err := f.fw.ClientSet().ResourceV1().DeviceClasses().Get(ctx, gpuClassName, metav1.GetOptions{})
		require.NoError(t, err)
		class.Spec.Selectors[0].CEL.Expression = expr
		_, err = f.fw.ClientSet().ResourceV1().DeviceClasses().Update(ctx, class, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.NoError(t, wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			seen, err := f.fw.SharedDRAManager().DeviceClasses().Get(gpuClassName)
			return err == nil && seen.Spec.Selectors[0].CEL.Expression == expr, nil
		}))
	}
	key, _ := gang.KeyOf(pods[0])

	setSelector(`device.driver == "gpu.example.com"`)
	_, status := f.preFilter(t, pods[0])
	require.False(t, status.IsSuccess(), "the class selects no device")
	assert.Contains(t, status.Message(), "0 free nvidia.com/gpu")
	assert.Nil(t, f.plugin.gangs.Plan(key))

	setSelector(`device.driver == "gpu.nvidia.com"`)
	_, status = f.preFilter(t, pods[0])
	require.True(t, status.IsSuccess(), status.Message())
	assert.Equal(t, map[string]int{"n1": 1, "n2": 1}, slotsByNode(f.plugin.gangs.Plan(key)))
}

// flakyClaims reports a concurrent modification the first times the
// allocated devices are listed, as the DRA manager does while a binding
// writes a claim.
type flakyClaims struct {
	fwk.ResourceClaimTracker
	fails int
}

// conflict is the error of the next answer, while any is to fail.
func (c *flakyClaims) conflict() error {
	if c.fails == 0 {
		return nil
	}
	c.fails--
	return errors.New("conflicting concurrent modification")
}

func (c *flakyClaims) ListAllAllocatedDevices() (sets.Set[structured.DeviceID], error) {
	if err := c.conflict(); err != nil {
		return nil, err
	}
	return c.ResourceClaimTracker.ListAllAllocatedDevices()
}

func (c *flakyClaims) GatherAllocatedState() (*structured.AllocatedState, error) {
	if err := c.conflict(); err != nil {
		return nil, err
	}
	return c.ResourceClaimTracker.GatherAllocatedState()
}

type flakyManager struct {
	fwk.SharedDRAManager
	claims *flakyClaims
}

func (m flakyManager) ResourceClaims() fwk.ResourceClaimTracker { return m.claims }

func TestDRASnapshotRetriesAConcurrentModification(t *testing.T) {
	// A concurrent modification is asked again, not taken for "no GPUs":
	// taking it so refused plans and started preemptions in the simulator.
	eight := []string{"a", "a", "a", "a", "a", "a", "a", "a"}
	pods := []*v1.Pod{worker("j", 0, 8, "")}
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, pods, draObjects(gpuSlice("n1", eight...))...)
	claims := &flakyClaims{ResourceClaimTracker: f.plugin.dra.manager.ResourceClaims(), fails: 3}
	f.plugin.dra.manager = flakyManager{SharedDRAManager: f.plugin.dra.manager, claims: claims}
	st, err := f.plugin.dra.snapshot(context.Background())
	require.NoError(t, err)
	require.NotNil(t, st)
	assert.Equal(t, map[string]int64{"n1": 8}, st.free)
	assert.Zero(t, claims.fails, "asked until it answered")
}

func TestDRAClaimSharedByMembersCountsOnce(t *testing.T) {
	// Two workers reference one ResourceClaim of one device. It is
	// allocated once, for both: the gang needs one device, not two, and
	// the second worker must be where the claim's device is (n2 has a
	// free device too, but the claim allocated on n1 is of no use there).
	nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}
	objs := draObjects(gpuSlice("n1", "a"), gpuSlice("n2", "a"))
	a, claim := claimWorker(0, "")
	b, _ := claimWorker(1, "")
	b.Spec.ResourceClaims[0].ResourceClaimName = ptr.To(claim.Name)
	// Workers of one per node cannot share a node-local claim: drop the
	// anti-affinity so they may.
	f := newTestFrameworkWith(t, 2, nodes, []*v1.Pod{a, b}, append(objs, claim)...)
	_, status := f.preFilter(t, a)
	require.True(t, status.IsSuccess(), status.Message())
	key, _ := gang.KeyOf(a)
	plan := f.plugin.gangs.Plan(key)
	assert.Equal(t, 1, len(slotsByNode(plan)), "both on the node of the claim's device: %v", plan.Slots)
	var gpus int64
	for _, r := range plan.Requests {
		gpus += r.Scalars["nvidia.com/gpu"]
	}
	assert.Equal(t, int64(1), gpus, "the shared claim's device counted once")
}

func TestDRASharedClaimKeepsMembersWhereItsDevicesAre(t *testing.T) {
	// As above, but the second worker's CPU does not fit beside the first
	// on n1: n2 has a free device, yet the claim allocated on n1 cannot
	// serve it there. No plan, rather than one the cycles would refuse.
	nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}
	objs := draObjects(gpuSlice("n1", "a"), gpuSlice("n2", "a"))
	a, claim := claimWorker(0, "")
	b, _ := claimWorker(1, "")
	b.Spec.ResourceClaims[0].ResourceClaimName = ptr.To(claim.Name)
	b.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("64")
	f := newTestFrameworkWith(t, 2, nodes, []*v1.Pod{a, b}, append(objs, claim)...)
	_, status := f.preFilter(t, a)
	require.False(t, status.IsSuccess(), "planned: %v", status.Message())
	key, _ := gang.KeyOf(a)
	assert.Nil(t, f.plugin.gangs.Plan(key))
}

func TestDRADevicesReleasedWaitsForEveryVictimClaim(t *testing.T) {
	// After a preemption the members wait, in PreFilter and PostFilter
	// alike, until no claim is still allocated and reserved for a victim: a NIC on a node whose GPUs are
	// the device plugin's counts as much as a DRA GPU, since the
	// DynamicResources filter would refuse the member for either.
	nicClaim := func(consumer types.UID, allocated bool) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nic-" + string(consumer), UID: types.UID("nic-" + consumer)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "nic",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "rdma.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
		if allocated {
			c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: string(consumer), UID: consumer}}
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "nic", Driver: "rdma.example.com", Pool: "n1", Device: "nic-0"}}}}
		}
		return c
	}
	evicted := &gang.ActivePlan{Evicted: sets.New[types.UID]("low-0")}
	for _, c := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		plan  *gang.ActivePlan
		want  bool
	}{
		{"a victim's claim is still allocated", nicClaim("low-0", true), evicted, false},
		{"the victim's claim is deallocated", nicClaim("low-0", false), evicted, true},
		{"a claim of a pod not preempted", nicClaim("other", true), evicted, true},
		{"a plan that preempted nothing", nicClaim("low-0", true), &gang.ActivePlan{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes := []*v1.Node{testobj.MakeNode("n1").GPUs(8).Rack("r1").Obj()}
			f := newTestFrameworkWith(t, 1, nodes, []*v1.Pod{worker("j", 0, 8, "")}, append(draObjects(), c.claim)...)
			assert.Equal(t, c.want, f.plugin.devicesReleased(c.plan))
			// A member refused at its slot meanwhile keeps it (PostFilter)
			// exactly while its PreFilter would hold it back.
			_, waiting := f.plugin.waitingForVictims(gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}, c.plan, "n1", nil, nil)
			assert.Equal(t, !c.want, waiting, "PostFilter waits for the victims' devices")
		})
	}
}

func TestDRAGPUClassUnderItsImplicitNameIsGPUs(t *testing.T) {
	// A GPU class serves its implicit extended resource name too: a pod
	// asking for it asks for GPUs, and is counted so (a lone pod would
	// otherwise pass Filter's check of held capacity with 0 GPUs). A NIC
	// class's resource is left to DynamicResources.
	rdma := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "rdma.example.com"},
		Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("example.com/rdma")}}
	asking := func(name v1.ResourceName, n int64) *v1.Pod {
		q := *resource.NewQuantity(n, resource.DecimalSI)
		return testobj.MakePod("ns", "p").UID("p").SchedulerName("muster").Container(testobj.MakeContainer("c").
			Request(name, q).Obj()).Obj()
	}
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, append(draObjects(gpuSlice("n1", "a", "a")), rdma)...)
	for _, c := range []struct {
		name v1.ResourceName
		want map[v1.ResourceName]int64
	}{
		{"nvidia.com/gpu", map[v1.ResourceName]int64{"nvidia.com/gpu": 2}},
		{v1.ResourceName(resourceapi.ResourceDeviceClassPrefix + gpuClassName), map[v1.ResourceName]int64{"nvidia.com/gpu": 2}},
		{"example.com/rdma", map[v1.ResourceName]int64{}},
		{v1.ResourceName(resourceapi.ResourceDeviceClassPrefix + "rdma.example.com"), map[v1.ResourceName]int64{}},
	} {
		got := f.plugin.requestOf(asking(c.name, 2)).Scalars
		if got == nil {
			got = map[v1.ResourceName]int64{}
		}
		assert.Equal(t, c.want, got, "a pod asking for 2 %s", c.name)
	}
}

func TestDRASharedClaimPreempts(t *testing.T) {
	// A low-priority pod holds n1's only device. Two high-priority workers
	// share one claim of one device: evicting the pod makes room for both.
	// In the victim search DynamicResources cannot see the device freed
	// and refuses each member; muster's trial view answers for the claim,
	// allocated once for the first member and serving the second.
	low := worker("low", 0, 1, "n1")
	low.Spec.Priority = ptr.To[int32](1)
	objs := append(draObjects(gpuSlice("n1", "a")), allocatedExtendedClaim(low, "n1", 1))
	a, claim := claimWorker(0, "")
	b, _ := claimWorker(1, "")
	b.Spec.ResourceClaims[0].ResourceClaimName = ptr.To(claim.Name)
	for _, p := range []*v1.Pod{a, b} {
		p.Spec.Priority = ptr.To[int32](100)
	}
	f := newTestFrameworkWith(t, 2, []*v1.Node{draNode("n1", "r1")}, []*v1.Pod{low, a, b}, append(objs, claim)...)
	plan := f.preemptFor(t, a)
	require.NotNil(t, plan, "no preemption")
	assert.Equal(t, []string{"low-0"}, sets.List(victimNames(plan, []*v1.Pod{low})))
	assert.Equal(t, map[string]int{"n1": 2}, slotsByNode(plan))
}

func TestDRATaintedDevicesAreNoFreeGPUs(t *testing.T) {
	// A device the driver taints NoSchedule or NoExecute (an unhealthy
	// GPU, say) is refused by the allocator to every claim that does not
	// tolerate it, an extended-resource claim's among them: it is no free
	// GPU. A taint of effect None keeps nothing away.
	slice := gpuSlice("n1", "a", "a", "a", "a")
	for i, effect := range []resourceapi.DeviceTaintEffect{resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNone} {
		slice.Spec.Devices[i].Taints = []resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/unhealthy", Effect: effect}}
	}
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, draObjects(slice)...)
	require.True(t, f.plugin.dra.features.DeviceTaints, "DRADeviceTaints is GA in 1.37")
	st, err := f.plugin.dra.snapshot(context.Background())
	require.NoError(t, err)
	require.NotNil(t, st)
	assert.Equal(t, int64(2), st.freeOn("n1"), "4 devices, 2 tainted away")
}

// partitionedNode publishes node's two GPUs the way a driver with
// partitionable devices does: a slice of shared counters (each GPU's
// memory) and a slice of devices drawing on them, each GPU whole (type
// gpu) and as a half (type mig). Only whole GPUs are in the GPU class.
func partitionedNode(node string) []runtime.Object {
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "whole-gpu"},
		Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("nvidia.com/gpu"),
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"`}}}}}
	pool := resourceapi.ResourcePool{Name: node, ResourceSliceCount: 2}
	counters := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-counters"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpuClassName, NodeName: ptr.To(node), Pool: pool}}
	devices := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-devices"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpuClassName, NodeName: ptr.To(node), Pool: pool}}
	for i := range 2 {
		set := fmt.Sprintf("gpu-%d", i)
		counters.Spec.SharedCounters = append(counters.Spec.SharedCounters, resourceapi.CounterSet{Name: set,
			Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("80Gi")}}})
		for _, d := range []struct{ name, typ, memory string }{{set, "gpu", "80Gi"}, {set + "-mig", "mig", "40Gi"}} {
			devices.Spec.Devices = append(devices.Spec.Devices, resourceapi.Device{Name: d.name,
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To(d.typ)}},
				ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: set,
					Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse(d.memory)}}}}})
		}
	}
	return []runtime.Object{class, counters, devices}
}

// allocatedDevice is a claim to which device of node's pool is allocated.
func allocatedDevice(node, device string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "holds-" + device, UID: types.UID("holds-" + device)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "whole-gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: gpuClassName, Pool: node, Device: device}}}}}}
}

func TestDRAPartitionedGPUsAreFreeOnlyWhileTheirCountersLast(t *testing.T) {
	// A GPU one of whose partitions is allocated is no free GPU, though
	// no claim holds the whole GPU's device: the allocator refuses it, its
	// memory counter being taken. The planner must not count it.
	for _, tc := range []struct {
		name      string
		allocated []string
		shared    bool // the allocations are shares of devices that allow several
		free      int64
	}{
		{name: "nothing allocated", free: 2},
		{name: "a partition of gpu-0 allocated", allocated: []string{"gpu-0-mig"}, free: 1},
		{name: "gpu-0 allocated whole", allocated: []string{"gpu-0"}, free: 1},
		{name: "a partition of each", allocated: []string{"gpu-0-mig", "gpu-1-mig"}, free: 0},
		// A partition that allows multiple allocations draws on the
		// counters once it is in use, though no claim holds it whole.
		{name: "a share of gpu-0's partition allocated", allocated: []string{"gpu-0-mig"}, shared: true, free: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := partitionedNode("n1")
			for _, dev := range tc.allocated {
				claim := allocatedDevice("n1", dev)
				if tc.shared {
					claim.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("share-" + dev))
					for i, d := range objs[2].(*resourceapi.ResourceSlice).Spec.Devices {
						if d.Name == dev {
							objs[2].(*resourceapi.ResourceSlice).Spec.Devices[i].AllowMultipleAllocations = ptr.To(true)
						}
					}
				}
				objs = append(objs, claim)
			}
			f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, objs...)
			require.True(t, f.plugin.dra.features.PartitionableDevices, "DRAPartitionableDevices is beta, on by default, in 1.37")
			st, err := f.plugin.dra.snapshot(context.Background())
			require.NoError(t, err)
			require.NotNil(t, st)
			assert.Equal(t, tc.free, st.freeOn("n1"), "free whole GPUs with %v allocated", tc.allocated)
		})
	}
}

func TestDRAGPUsOfAPoolInTransitAreNotFree(t *testing.T) {
	// The allocator takes devices only from a pool's newest generation,
	// and only once all of that generation's slices are there: while a
	// driver republishes a node's GPUs their count is what the allocator
	// will give, not the sum of old and new slices.
	slice := func(name string, generation, count int64, devices int) *resourceapi.ResourceSlice {
		s := gpuSlice("n1", slices.Repeat([]string{"a"}, devices)...)
		s.Name = name
		s.Spec.Pool.Generation, s.Spec.Pool.ResourceSliceCount = generation, count
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].Name = fmt.Sprintf("%s-gpu-%d", name, i)
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		slices []*resourceapi.ResourceSlice
		free   int64
	}{
		{"complete", []*resourceapi.ResourceSlice{slice("a", 1, 2, 4), slice("b", 1, 2, 4)}, 8},
		{"one of two slices published", []*resourceapi.ResourceSlice{slice("a", 1, 2, 4)}, 0},
		{"generation 2 replaces generation 1", []*resourceapi.ResourceSlice{slice("old", 1, 1, 4), slice("new", 2, 1, 2)}, 2},
		{"generation 2 not complete yet", []*resourceapi.ResourceSlice{slice("old", 1, 1, 4), slice("new", 2, 2, 2)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, draObjects(tc.slices...)...)
			st, err := f.plugin.dra.snapshot(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.free, st.freeOn("n1"))
		})
	}
}

func TestDRASharedGPUsAreFreeWhileAShareFits(t *testing.T) {
	// A device that allows multiple allocations (DRAConsumableCapacity,
	// beta and on in 1.37) takes a further claim while its capacity lasts.
	// A whole-GPU request names no capacity, so the allocator charges it
	// each capacity's policy default, or all of it without a policy: a
	// device shared by others is free only while that charge still fits.
	shareable := func(policy *resourceapi.CapacityRequestPolicy) *resourceapi.ResourceSlice {
		s := gpuSlice("n1", "a100", "a100")
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].AllowMultipleAllocations = ptr.To(true)
			s.Spec.Devices[i].Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("80Gi"), RequestPolicy: policy}}
		}
		return s
	}
	share := func(name, device, memory string) *resourceapi.ResourceClaim {
		claim := allocatedDevice("n1", device)
		claim.Name, claim.UID = name, types.UID(name)
		claim.Spec.Devices.Requests[0].Exactly.DeviceClassName = gpuClassName
		res := &claim.Status.Allocation.Devices.Results[0]
		res.ShareID = ptr.To(types.UID(name))
		res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)}
		return claim
	}
	tenGi := &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("10Gi")),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi"))}}
	for _, tc := range []struct {
		name   string
		policy *resourceapi.CapacityRequestPolicy
		claims []*resourceapi.ResourceClaim
		free   int64
	}{
		{name: "no share allocated", free: 2},
		{name: "a share of gpu-0, no policy: the next takes all", claims: []*resourceapi.ResourceClaim{share("s1", "gpu-0", "10Gi")}, free: 1},
		{name: "default 10Gi, 70Gi of gpu-0 taken", policy: tenGi,
			claims: []*resourceapi.ResourceClaim{share("s1", "gpu-0", "40Gi"), share("s2", "gpu-0", "30Gi")}, free: 2},
		{name: "default 10Gi, 75Gi of gpu-0 taken", policy: tenGi,
			claims: []*resourceapi.ResourceClaim{share("s1", "gpu-0", "75Gi")}, free: 1},
		{name: "a policy without a default may refuse the whole value", policy: &resourceapi.CapacityRequestPolicy{
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi")), Max: ptr.To(resource.MustParse("40Gi"))}}, free: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := draObjects(shareable(tc.policy))
			for _, c := range tc.claims {
				objs = append(objs, c)
			}
			f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, objs...)
			require.True(t, f.plugin.dra.features.ConsumableCapacity, "DRAConsumableCapacity is beta, on by default, in 1.37")
			st, err := f.plugin.dra.snapshot(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.free, st.freeOn("n1"), "free whole GPUs with shares %v", tc.claims)
		})
	}

	// A share's pod frees no whole GPU when it is evicted.
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, draObjects(shareable(nil))...)
	assert.Zero(t, f.plugin.dra.allocatedGPUs(share("s1", "gpu-0", "10Gi")))
	whole := allocatedDevice("n1", "gpu-0")
	whole.Spec.Devices.Requests[0].Exactly.DeviceClassName = gpuClassName
	assert.EqualValues(t, 1, f.plugin.dra.allocatedGPUs(whole))
}

func TestDRAPoolNamingCompatibilityGroupsIsNotCountedWhileTheGateIsOff(t *testing.T) {
	// While DRADeviceCompatibilityGroups (alpha, off in 1.37) is off, the
	// allocator ignores a slice whose devices name compatibility groups,
	// which leaves its pool incomplete: none of the pool's GPUs is given.
	objs := partitionedNode("n1")
	devices := objs[2].(*resourceapi.ResourceSlice)
	devices.Spec.Devices[1].ConsumesCounters[0].CompatibilityGroups = []string{"mig-40g"}
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, objs...)
	require.False(t, f.plugin.dra.features.CompatibilityGroups, "DRADeviceCompatibilityGroups is alpha, off by default, in 1.37")
	st, err := f.plugin.dra.snapshot(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.freeOn("n1"))
}

func TestDRAGPUsOfASliceThatSelectsNodesPerDeviceAreTheirNodes(t *testing.T) {
	// A slice with perDeviceNodeSelection (DRAPartitionableDevices) names
	// the node of each device: those GPUs are their nodes' GPUs. A device
	// for all nodes is network-attached: no node's.
	s := gpuSlice("n1", "a100", "a100", "a100")
	s.Spec.NodeName, s.Spec.PerDeviceNodeSelection = nil, ptr.To(true)
	s.Spec.Devices[0].NodeName = ptr.To("n1")
	s.Spec.Devices[1].NodeName = ptr.To("n2")
	s.Spec.Devices[2].AllNodes = ptr.To(true)
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}, nil, draObjects(s)...)
	st, err := f.plugin.dra.snapshot(context.Background())
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"n1": 1, "n2": 1}, st.free)
}

func TestDRATopologyFromDevicesThatNameTheirNodes(t *testing.T) {
	// A slice that selects nodes per device gives each node the attribute
	// of the devices that name it; a node's own slice comes first.
	const clique = "gpu.nvidia.com/clique"
	args := defaultArgs(t)
	args.TopologyLevels = append([]config.TopologyLevel{{Name: "node", NodeLabel: "kubernetes.io/hostname"},
		{Name: "clique", DeviceAttribute: clique}}, args.TopologyLevels[1:]...)
	perDevice := gpuSlice("n1", "a100", "a100", "a100")
	perDevice.Spec.NodeName, perDevice.Spec.PerDeviceNodeSelection = nil, ptr.To(true)
	for i, d := range []struct{ node, clique string }{{"n1", "A"}, {"n2", "B"}, {"n3", "B"}} {
		perDevice.Spec.Devices[i].NodeName = ptr.To(d.node)
		perDevice.Spec.Devices[i].Attributes["clique"] = resourceapi.DeviceAttribute{StringValue: ptr.To(d.clique)}
	}
	local := gpuSlice("n3", "a100")
	local.Spec.Devices[0].Attributes["clique"] = resourceapi.DeviceAttribute{StringValue: ptr.To("C")}
	nodes := []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1"), draNode("n3", "r1")}
	f := newTestFrameworkWith(t, 1, nodes, nil, append(draObjects(perDevice, local), args)...)
	_, err := f.plugin.dra.snapshot(context.Background())
	require.NoError(t, err)
	domains := map[string]string{}
	for _, n := range nodes {
		domains[n.Name] = f.plugin.dra.Domain(n.Name, clique)
	}
	assert.Equal(t, map[string]string{"n1": "A", "n2": "B", "n3": "C"}, domains)
}

func TestDRAPreemptionKeepsAMemberWhereItsAllocatedClaimIs(t *testing.T) {
	// j-0 asks for one GPU (served by DRA) and holds a NIC claim already
	// allocated on n1, whose node selector names n1 only. n1's two GPUs
	// run a pod of j-0's priority; n2's only GPU runs a priority-1 pod.
	// Evicting that pod would free a GPU on n2, but the NIC cannot be used
	// there: DynamicResources refuses n2 for the claim, and the dry run,
	// which overrides its refusal because it cannot see the victim's GPU
	// freed, must refuse n2 too. Nothing is evicted.
	keeper := worker("keeper", 0, 2, "n1")
	keeper.Spec.Priority = ptr.To[int32](100)
	low := worker("low", 0, 1, "n2")
	low.Spec.Priority = ptr.To[int32](1)
	nicClass := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "rdma.example.com"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "rdma.example.com"`}}}}}
	nics := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n1-nics"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "rdma.example.com", NodeName: ptr.To("n1"), Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "nic-0"}}}}
	j0 := worker("j", 0, 1, "")
	j0.Spec.Priority = ptr.To[int32](100)
	j0.Spec.Affinity = nil
	nic := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "j-0-nic", UID: "j-0-nic"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "nic",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "rdma.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "nic", Driver: "rdma.example.com", Pool: "n1", Device: "nic-0"}}},
			NodeSelector: selectingNode("n1")}}}
	j0.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To(nic.Name)}}
	j0.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "nic"}}
	objs := append(draObjects(gpuSlice("n1", "a", "a"), gpuSlice("n2", "a")), nicClass, nics, nic,
		allocatedExtendedClaim(keeper, "n1", 2), allocatedExtendedClaim(low, "n2", 1))
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1"), draNode("n2", "r1")}, []*v1.Pod{keeper, low, j0}, objs...)
	assert.Nil(t, f.preemptFor(t, j0), "preempted on a node where the member's NIC claim cannot be used")
}

// A member's claim was allocated, and reserved for it, by an earlier
// attempt whose binding never happened (the scheduler stopped after
// PreBind): the claim ties the member to n1, which has since been
// cordoned, so the gang cannot be planned, and the DynamicResources Filter,
// which would have found the claim unusable, never ran. muster's PostFilter
// releases the allocation, as the DynamicResources PostFilter does, and
// the next plan places the gang on n2 and n3. A claim someone else also
// uses is left as it is.
func TestDRAEarlierAllocationIsReleased(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared bool
		// group: the gang is a Kubernetes PodGroup, refused in its
		// pod-group cycle (PodGroupPostFilter).
		group bool
	}{
		{name: "reserved for the member alone"},
		{name: "reserved for another pod too", shared: true},
		{name: "in a PodGroup's cycle", group: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := draObjects(gpuSlice("n1", "a"), gpuSlice("n2", "a"), gpuSlice("n3", "a"))
			var pods []*v1.Pod
			var stale *resourceapi.ResourceClaim
			for i := range 2 {
				pod, claim := claimWorker(i, "")
				if i == 0 {
					claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
						Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: gpuClassName, Pool: "n1", Device: "gpu-0"}}},
						NodeSelector: selectingNode("n1")}
					claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
					if tc.shared {
						claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "other", UID: "other"})
					}
					stale = claim
				}
				pods = append(pods, pod)
				objs = append(objs, claim)
			}
			cordoned := draNode("n1", "r1")
			cordoned.Spec.Unschedulable = true
			stale.ResourceVersion = "1"
			f := newTestFrameworkWith(t, 2, []*v1.Node{cordoned, draNode("n2", "r1"), draNode("n3", "r1")}, pods, objs...)
			key, _ := gang.KeyOf(pods[0])
			// The fake API server keeps the resourceVersion it is sent; the
			// scheduler's claim cache takes only a newer one.
			f.plugin.handle.ClientSet().(*fake.Clientset).PrependReactor("update", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
				action.(k8stesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim).ResourceVersion = "2"
				return false, nil, nil
			})

			state, status := f.preFilter(t, pods[0])
			require.False(t, status.IsSuccess(), "a member tied to a cordoned node was planned")
			if tc.group {
				_, status = f.plugin.PodGroupPostFilter(context.Background(), framework.NewCycleState(), unscheduledGroup{pods: pods}, nil)
			} else {
				_, status = f.fw.RunPostFilterPlugins(context.Background(), state, pods[0], framework.NewDefaultNodeToStatus())
			}
			claims := f.plugin.handle.ClientSet().ResourceV1().ResourceClaims("ns")
			got, err := claims.Get(context.Background(), stale.Name, metav1.GetOptions{})
			require.NoError(t, err)
			if tc.shared {
				assert.NotNil(t, got.Status.Allocation, "a claim another pod uses was released")
				assert.Len(t, got.Status.ReservedFor, 2)
				return
			}
			assert.Contains(t, status.Message(), "released ResourceClaim "+stale.Name)
			assert.Nil(t, got.Status.Allocation, "the earlier allocation stands")
			assert.Empty(t, got.Status.ReservedFor)

			// Once the scheduler's view has the release, the gang is planned
			// away from the cordoned node.
			require.NoError(t, wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				c, err := f.fw.SharedDRAManager().ResourceClaims().Get("ns", stale.Name)
				return err == nil && c.Status.Allocation == nil, nil
			}))
			f.clock.Step(time.Minute) // past the gang's backoff
			_, status = f.preFilter(t, pods[0])
			require.True(t, status.IsSuccess(), status.Message())
			assert.Equal(t, map[string]int{"n2": 1, "n3": 1}, slotsByNode(f.plugin.gangs.Plan(key)))
		})
	}
}

// selectingNode selects node by name, as the allocation of a node's devices does.
func selectingNode(node string) *v1.NodeSelector {
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}}
}

// The DRA cache keeps the slices listed last, and the nodes and device
// domains of those only: a fleet whose nodes (and slices) are replaced
// every day leaves nothing of the old ones behind.
func TestDRACacheForgetsSlicesThatWent(t *testing.T) {
	eight := []string{"a100", "a100", "a100", "a100", "a100", "a100", "a100", "a100"}
	f := newTestFrameworkWith(t, 1, []*v1.Node{draNode("n1", "r1")}, nil, draObjects(gpuSlice("n1", eight...))...)
	d := f.plugin.dra
	for day := range 30 {
		var listed []*resourceapi.ResourceSlice
		for i := range 10 {
			listed = append(listed, gpuSlice(fmt.Sprintf("d%d-n%d", day, i), eight...))
		}
		d.mu.Lock()
		require.Positive(t, d.index(t.Context(), listed), "no GPU class")
		d.mu.Unlock()
		sizes := f.plugin.Sizes()
		assert.Equal(t, 10, sizes["DRA slices"], "day %d", day)
		assert.Equal(t, 10, sizes["DRA nodes"], "day %d", day)
	}
	d.mu.Lock()
	d.index(t.Context(), nil)
	d.mu.Unlock()
	sizes := f.plugin.Sizes()
	assert.Zero(t, sizes["DRA slices"], "every slice gone")
	assert.Zero(t, sizes["DRA nodes"]+sizes["DRA node domains"], "every slice gone")
}
