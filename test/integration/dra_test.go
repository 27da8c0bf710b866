package integration

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// GPUs from dynamic resource allocation (DRA). A DRA node advertises no
// nvidia.com/gpu in its allocatable; its GPUs are the devices of the
// ResourceSlice GPUDriver's kubelet plugin publishes for it (pool = node).
// The scheduler's DynamicResources plugin allocates them at PreBind: to the
// pod's own ResourceClaim, or, for a pod asking for the extended resource
// nvidia.com/gpu, to a claim it creates for the pod (owned by it, named in
// pod.status.extendedResourceClaimStatus) through the DeviceClass whose
// extendedResourceName is nvidia.com/gpu. muster must count those devices
// as the node's GPUs when it plans a gang.

// draBackgroundPerNode is the number of background CPU pods on each node
// the DRA cluster starts with.
const draBackgroundPerNode = 4

// draNode is a Ready node in rack r1 whose GPUs are served by DRA only: no
// nvidia.com/gpu in its capacity or allocatable.
func draNode(name string) *corev1.Node {
	return testobj.MakeNode(name).NoGPUResource().Rack("r1").Ready().Obj()
}

// draNodes is n DRA nodes node-1..node-n.
func draNodes(n int) []*corev1.Node {
	nodes := make([]*corev1.Node, n)
	for i := range nodes {
		nodes[i] = draNode(fmt.Sprintf("node-%d", i+1))
	}
	return nodes
}

// startDRACluster starts a control plane with the GPU DeviceClass, the
// DRA nodes each with a ResourceSlice of gpus devices, the other nodes
// (device-plugin GPU nodes, say) as they are, the background of a real
// cluster on every node, and then the muster scheduler, so its informers
// find the DRA objects from the start.
func startDRACluster(t *testing.T, dra []*corev1.Node, gpus int, other ...*corev1.Node) *cluster {
	t.Helper()
	return startDRAClusterWith(t, "", dra, gpus, other...)
}

// startDRAClusterWith is startDRACluster with extra top-level configuration
// appended to the shipped scheduler configuration (an extender, say).
func startDRAClusterWith(t *testing.T, extraConfig string, dra []*corev1.Node, gpus int, other ...*corev1.Node) *cluster {
	t.Helper()
	nodes := append(slices.Clone(dra), other...)
	c := startClusterWithoutScheduler(t, nodes...)
	c.requireServesDRA()
	_, err := c.Client.ResourceV1().DeviceClasses().Create(c.ctx, testobj.GPUDeviceClass(), metav1.CreateOptions{})
	require.NoError(t, err, "creating the GPU DeviceClass")
	for _, n := range dra {
		c.publishGPUs(n.Name, gpus)
	}
	c.addBackground(draBackgroundPerNode, nodes...)
	t.Cleanup(c.logDRAStateOnFailure)
	c.startScheduler(extraConfig)
	return c
}

// requireServesDRA checks that the API server serves resource.k8s.io/v1
// with the kinds the tests use.
func (c *cluster) requireServesDRA() {
	c.t.Helper()
	list, err := c.Client.Discovery().ServerResourcesForGroupVersion(resourcev1.SchemeGroupVersion.String())
	require.NoError(c.t, err, "discovery of %s", resourcev1.SchemeGroupVersion)
	var served []string
	for _, r := range list.APIResources {
		served = append(served, r.Name)
	}
	for _, want := range []string{"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} {
		require.Contains(c.t, served, want, "%s resources", resourcev1.SchemeGroupVersion)
	}
}

// publishGPUs creates node's ResourceSlice of gpus devices, as the driver's
// kubelet plugin would once the node registered.
func (c *cluster) publishGPUs(node string, gpus int) {
	c.t.Helper()
	_, err := c.Client.ResourceV1().ResourceSlices().Create(c.ctx, testobj.GPUSlice(node, gpus), metav1.CreateOptions{})
	require.NoError(c.t, err, "publishing the GPUs of %s", node)
}

// addDRANode adds a DRA node and then its ResourceSlice of gpus devices.
func (c *cluster) addDRANode(name string, gpus int) {
	c.t.Helper()
	c.addNodes(draNode(name))
	c.publishGPUs(name, gpus)
}

// deviceID names one device: driver, pool, device.
type deviceID struct{ driver, pool, device string }

func (d deviceID) String() string { return d.driver + "/" + d.pool + "/" + d.device }

// claims lists the ResourceClaims of every namespace.
func (c *cluster) claims() []resourcev1.ResourceClaim {
	c.t.Helper()
	list, err := c.Client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(c.ctx, metav1.ListOptions{})
	require.NoError(c.t, err)
	return list.Items
}

// allocatedClaims names the claims of every namespace that are allocated.
func (c *cluster) allocatedClaims() []string {
	c.t.Helper()
	var out []string
	for _, claim := range c.claims() {
		if claim.Status.Allocation != nil {
			out = append(out, claim.Namespace+"/"+claim.Name)
		}
	}
	return out
}

// requireNoDeviceTwice fails the test if a device is allocated to more than
// one claim (no claim here is shared).
func (c *cluster) requireNoDeviceTwice() {
	c.t.Helper()
	owners := map[deviceID][]string{}
	for _, claim := range c.claims() {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			id := deviceID{r.Driver, r.Pool, r.Device}
			owners[id] = append(owners[id], claim.Namespace+"/"+claim.Name)
		}
	}
	var twice []string
	for id, claims := range owners {
		if len(claims) > 1 {
			twice = append(twice, fmt.Sprintf("%s allocated to %v", id, claims))
		}
	}
	sort.Strings(twice)
	require.Empty(c.t, twice, "devices allocated to more than one claim")
}

// checkClaimAllocated says why claim is not allocated gpus devices of
// GPUDriver from the pool of the pod's node and reserved for the pod, or
// returns nil.
func checkClaimAllocated(claim *resourcev1.ResourceClaim, pod *corev1.Pod, gpus int) error {
	name := claim.Namespace + "/" + claim.Name
	if claim.Status.Allocation == nil {
		return fmt.Errorf("claim %s of pod %s is not allocated", name, pod.Name)
	}
	results := claim.Status.Allocation.Devices.Results
	if len(results) != gpus {
		return fmt.Errorf("claim %s of pod %s has %d devices allocated, want %d", name, pod.Name, len(results), gpus)
	}
	for _, r := range results {
		if r.Driver != testobj.GPUDriver || r.Pool != pod.Spec.NodeName {
			return fmt.Errorf("claim %s of pod %s on %s has device %s/%s/%s, want a %s device of pool %s",
				name, pod.Name, pod.Spec.NodeName, r.Driver, r.Pool, r.Device, testobj.GPUDriver, pod.Spec.NodeName)
		}
	}
	if !slices.ContainsFunc(claim.Status.ReservedFor, func(ref resourcev1.ResourceClaimConsumerReference) bool {
		return ref.Resource == "pods" && ref.UID == pod.UID
	}) {
		return fmt.Errorf("claim %s is not reserved for pod %s: %+v", name, pod.Name, claim.Status.ReservedFor)
	}
	return nil
}

// getClaim reads claim namespace/name.
func (c *cluster) getClaim(namespace, name string) (*resourcev1.ResourceClaim, error) {
	return c.Client.ResourceV1().ResourceClaims(namespace).Get(c.ctx, name, metav1.GetOptions{})
}

// extendedClaimAllocated says why the pod's extended-resource claim (the
// one the scheduler made for its nvidia.com/gpu) is not allocated gpus
// devices of its node, or returns nil.
func (c *cluster) extendedClaimAllocated(pod *corev1.Pod, gpus int) error {
	status := pod.Status.ExtendedResourceClaimStatus
	if status == nil || status.ResourceClaimName == "" {
		return fmt.Errorf("pod %s on %s has no status.extendedResourceClaimStatus", pod.Name, pod.Spec.NodeName)
	}
	claim, err := c.getClaim(pod.Namespace, status.ResourceClaimName)
	if err != nil {
		return fmt.Errorf("extended-resource claim of pod %s: %w", pod.Name, err)
	}
	if !slices.ContainsFunc(claim.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Pod" && o.UID == pod.UID }) {
		return fmt.Errorf("extended-resource claim %s is not owned by pod %s: %+v", claim.Name, pod.Name, claim.OwnerReferences)
	}
	return checkClaimAllocated(claim, pod, gpus)
}

// podClaimName is the ResourceClaim behind the pod's claim name: the one it
// names, or the one the ResourceClaim controller made from its template
// (pod.status.resourceClaimStatuses); "" while there is none yet.
func podClaimName(pod *corev1.Pod, name string) string {
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name == name && pc.ResourceClaimName != nil {
			return *pc.ResourceClaimName
		}
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == name && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

// podClaimAllocated says why the ResourceClaim behind the pod's claim
// GPURequestName is not allocated gpus devices of its node, or returns nil.
func (c *cluster) podClaimAllocated(pod *corev1.Pod, gpus int) error {
	name := podClaimName(pod, testobj.GPURequestName)
	if name == "" {
		return fmt.Errorf("pod %s has no ResourceClaim for its claim %q", pod.Name, testobj.GPURequestName)
	}
	claim, err := c.getClaim(pod.Namespace, name)
	if err != nil {
		return fmt.Errorf("claim of pod %s: %w", pod.Name, err)
	}
	return checkClaimAllocated(claim, pod, gpus)
}

// eventually polls check every 100ms until it returns nil, and fails the
// test with its last answer if timeout passes first.
func (c *cluster) eventually(what string, timeout time.Duration, check func() error) {
	c.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = check()
		return last == nil, nil
	})
	if err != nil {
		c.t.Fatalf("waiting %s for %s: %v; last: %v", timeout, what, err, last)
	}
}

// holds polls check every 200ms for d and fails the test the first time
// it returns an error: nothing of the kind happens meanwhile.
func (c *cluster) holds(what string, d time.Duration, check func() error) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.ctx, 200*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		return false, check()
	})
	if !wait.Interrupted(err) {
		c.t.Fatalf("%s did not hold for %s: %v", what, d, err)
	}
}

// nothingBoundNorAllocated is a check for holds: none of the pods list
// returns is bound and no ResourceClaim is allocated.
func (c *cluster) nothingBoundNorAllocated(list func() []corev1.Pod) func() error {
	return func() error {
		var bound []string
		for _, p := range list() {
			if p.Spec.NodeName != "" {
				bound = append(bound, p.Name+" on "+p.Spec.NodeName)
			}
		}
		if len(bound) > 0 {
			return fmt.Errorf("pods bound: %v", bound)
		}
		if allocated := c.allocatedClaims(); len(allocated) > 0 {
			return fmt.Errorf("claims allocated: %v", allocated)
		}
		return nil
	}
}

// requireRefused checks that each of pods was tried and refused
// (PodScheduled=False) and logs why.
func requireRefused(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if !assert.True(t, unschedulableWith(&p), "pod %s has no PodScheduled=False condition: %+v", p.Name, p.Status.Conditions) {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled {
				t.Logf("pod %s refused: %s", p.Name, cond.Message)
			}
		}
	}
}

// waitPods waits until list returns want pods.
func (c *cluster) waitPods(what string, want int, list func() []corev1.Pod) []corev1.Pod {
	c.t.Helper()
	var pods []corev1.Pod
	c.waitFor(fmt.Sprintf("%d %s", want, what), 30*time.Second, func() (bool, error) {
		pods = list()
		return len(pods) == want, nil
	})
	return pods
}

// logDRAStateOnFailure logs the test namespace's pods and Events and every
// claim when the test failed.
func (c *cluster) logDRAStateOnFailure() {
	if !c.t.Failed() {
		return
	}
	pods, err := c.Client.CoreV1().Pods(c.ns).List(c.ctx, metav1.ListOptions{})
	if err == nil {
		for _, p := range pods.Items {
			var conds []string
			for _, cond := range p.Status.Conditions {
				conds = append(conds, fmt.Sprintf("%s=%s %s %q", cond.Type, cond.Status, cond.Reason, cond.Message))
			}
			c.t.Logf("pod %s: node %q nominated %q deleting %v phase %s extendedResourceClaimStatus %+v resourceClaimStatuses %s conditions %v",
				p.Name, p.Spec.NodeName, p.Status.NominatedNodeName, p.DeletionTimestamp != nil, p.Status.Phase,
				p.Status.ExtendedResourceClaimStatus, describeClaimStatuses(p.Status.ResourceClaimStatuses), conds)
		}
	}
	events, err := c.Client.EventsV1().Events(c.ns).List(c.ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range events.Items {
			c.t.Logf("event %s on %s %s: %s", e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Note)
		}
	}
	for _, claim := range c.claims() {
		var devices []string
		if claim.Status.Allocation != nil {
			for _, r := range claim.Status.Allocation.Devices.Results {
				devices = append(devices, deviceID{r.Driver, r.Pool, r.Device}.String())
			}
		}
		var owners, reserved []string
		for _, o := range claim.OwnerReferences {
			owners = append(owners, o.Kind+"/"+o.Name)
		}
		for _, r := range claim.Status.ReservedFor {
			reserved = append(reserved, r.Resource+"/"+r.Name)
		}
		c.t.Logf("claim %s/%s: owners %v allocated %v (%v) reservedFor %v deleting %v",
			claim.Namespace, claim.Name, owners, claim.Status.Allocation != nil, devices, reserved, claim.DeletionTimestamp != nil)
	}
}

func describeClaimStatuses(statuses []corev1.PodResourceClaimStatus) string {
	var out []string
	for _, s := range statuses {
		name := "<none>"
		if s.ResourceClaimName != nil {
			name = *s.ResourceClaimName
		}
		out = append(out, s.Name+"="+name)
	}
	return "[" + strings.Join(out, " ") + "]"
}

// A Job of 4 workers each asking for `limits: nvidia.com/gpu: 8` on 3 DRA
// nodes of 8 devices: muster must count the devices as the nodes' GPUs,
// so the gang (32 GPUs) does not fit on 24; nothing binds and no claim is
// allocated. A 4th node and its slice come: all 4 bind, one per node, each
// with its extended-resource claim allocated 8 devices of its node, and no
// device twice.
func TestDRAExtendedResourceGang(t *testing.T) {
	c := startDRACluster(t, draNodes(3), 8)
	obs := c.observeGangs(map[string]int{"mnist": 4})
	// BackoffLimit 3: a failed worker is replaced (see below).
	c.createJob(jobSpec{name: "mnist", workers: 4, gpus: 8, mutate: func(job *batchv1.Job) { job.Spec.BackoffLimit = ptr.To[int32](3) }})
	list := func() []corev1.Pod { return c.jobPods("mnist") }
	c.waitPods("pods of job mnist", 4, list)
	c.holds("nothing of mnist bound and no claim allocated on 24 DRA GPUs", 20*time.Second, c.nothingBoundNorAllocated(list))
	requireRefused(t, list())

	c.addDRANode("node-4", 8)
	pods := c.waitJobBound("mnist", 4)
	require.Len(t, nodesOf(pods), 4, "one 8-GPU worker per node: %v", nodesOf(pods))
	c.eachClaimAllocated("every worker's extended-resource claim allocated 8 devices of its node",
		func() []corev1.Pod { return c.jobPods("mnist") }, func(p *corev1.Pod) error { return c.extendedClaimAllocated(p, 8) })
	c.requireNoDeviceTwice()

	// The life of the job: the worker on node-2 fails. Its claim is
	// released, and the Job controller's replacement goes to node-2, the one
	// node with 8 free devices, with a claim of its own.
	pods = c.failOneAndWaitReplaced("mnist", 4, "node-2")
	require.Len(t, nodesOf(pods), 4, "after the replacement, one worker per node: %v", nodesOf(pods))
	c.eachClaimAllocated("every live worker's claim allocated 8 devices of its node",
		func() []corev1.Pod { return live(c.jobPods("mnist")) }, func(p *corev1.Pod) error { return c.extendedClaimAllocated(p, 8) })
	c.requireNoDeviceTwice()
	obs.check(t, 10*time.Second)
	assert.Equal(t, 3*draBackgroundPerNode, c.backgroundLeft(), "background CPU pods left")
}

// eachClaimAllocated waits until allocated says nil for every pod list
// returns (within 30 s).
func (c *cluster) eachClaimAllocated(what string, list func() []corev1.Pod, allocated func(*corev1.Pod) error) {
	c.t.Helper()
	c.eventually(what, 30*time.Second, func() error {
		for _, p := range list() {
			if err := allocated(&p); err != nil {
				return err
			}
		}
		return nil
	})
}

// createClaimPod creates pod name of PodGroup group whose one container
// uses ResourceClaim claim (pod claim GPURequestName) and asks for no
// nvidia.com/gpu.
func (c *cluster) createClaimPod(group, name, claim string) {
	c.t.Helper()
	pod := testobj.MakePod(c.ns, name).Label(v1alpha1.PodGroupLabel, group).
		PodSpec(testobj.DRAWorkerPodSpec(schedulerName)).ResourceClaim(testobj.GPURequestName, claim).Obj()
	_, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, pod, metav1.CreateOptions{})
	require.NoError(c.t, err, "creating pod %s", name)
}

// waitOneDevicePerNode waits until the 4 pods list returns are bound on 4
// nodes, each with the claim behind its pod claim allocated one device of
// its node, and no device is allocated twice.
func (c *cluster) waitOneDevicePerNode(what string, list func() []corev1.Pod) {
	c.t.Helper()
	pods := c.waitAllBound(what, 4, list)
	require.Len(c.t, nodesOf(pods), 4, "%s on 4 distinct nodes: %v", what, nodesOf(pods))
	c.eachClaimAllocated("the claim of each of "+what+" allocated 1 device of its node",
		list, func(p *corev1.Pod) error { return c.podClaimAllocated(p, 1) })
	c.requireNoDeviceTwice()
}

// A PodGroup gang of 4 whose pods each have their own ResourceClaim of one
// GPU, on 3 DRA nodes of one device: nothing binds and no claim is
// allocated; a 4th node and its slice come: all 4 bind on 4 nodes, each
// claim allocated one device of its pod's node, none twice.
func TestDRAClaimPerWorker(t *testing.T) {
	c := startDRACluster(t, draNodes(3), 1)
	obs := c.observeGangsBy(v1alpha1.PodGroupLabel, map[string]int{"workers": 4})
	c.createPodGroup("workers", 4, nil)
	for i := range 4 {
		claim := fmt.Sprintf("worker-%d-gpu", i)
		_, err := c.Client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, testobj.GPUClaim(c.ns, claim, 1), metav1.CreateOptions{})
		require.NoError(t, err)
		c.createClaimPod("workers", fmt.Sprintf("worker-%d", i), claim)
	}
	list := func() []corev1.Pod { return c.groupPods("workers") }
	c.waitPods("members of workers", 4, list)
	c.holds("nothing of workers bound and no claim allocated on 3 DRA GPUs", 20*time.Second, c.nothingBoundNorAllocated(list))
	requireRefused(t, list())

	c.addDRANode("node-4", 1)
	c.waitOneDevicePerNode("members of workers", list)
	obs.check(t, 10*time.Second)
	assert.Equal(t, 3*draBackgroundPerNode, c.backgroundLeft(), "background CPU pods left")
}

// A Job gang of 4 whose pod template asks for one GPU through a
// ResourceClaimTemplate: the ResourceClaim controller makes each pod its
// claim. On 3 one-device DRA nodes nothing binds and no claim is
// allocated; with a 4th all bind on 4 nodes, one device each, none twice.
// Deleting the Job releases the claims: the controller deallocates them and
// the garbage collector deletes them with their pods.
func TestDRAClaimTemplateJob(t *testing.T) {
	c := startDRACluster(t, draNodes(3), 1)
	require.NoError(t, c.StartGarbageCollector())
	_, err := c.Client.ResourceV1().ResourceClaimTemplates(c.ns).Create(c.ctx, testobj.GPUClaimTemplate(c.ns, "one-gpu", 1), metav1.CreateOptions{})
	require.NoError(t, err)
	obs := c.observeGangs(map[string]int{"tmpl": 4})
	job := testobj.MakeJob(c.ns, "tmpl").Indexed().Workers(4).BackoffLimit(0).
		PodSpec(testobj.DRAWorkerPodSpec(schedulerName)).ResourceClaimTemplate(testobj.GPURequestName, "one-gpu").Obj()
	_, err = c.Client.BatchV1().Jobs(c.ns).Create(c.ctx, job, metav1.CreateOptions{})
	require.NoError(t, err)
	list := func() []corev1.Pod { return c.jobPods("tmpl") }

	// The ResourceClaim controller gives each pod a claim of its own, owned
	// by the pod.
	c.eventually("a claim made from the template for each of the 4 pods", 30*time.Second, func() error {
		pods := list()
		if len(pods) != 4 {
			return fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			name := podClaimName(&p, testobj.GPURequestName)
			if name == "" {
				return fmt.Errorf("pod %s has no claim yet", p.Name)
			}
			claim, err := c.getClaim(c.ns, name)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(claim.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == p.UID }) {
				return fmt.Errorf("claim %s not owned by pod %s", name, p.Name)
			}
		}
		return nil
	})
	c.holds("nothing of tmpl bound and no claim allocated on 3 DRA GPUs", 20*time.Second, c.nothingBoundNorAllocated(list))
	requireRefused(t, list())

	c.addDRANode("node-4", 1)
	c.waitOneDevicePerNode("pods of job tmpl", list)
	obs.check(t, 10*time.Second)
	assert.Equal(t, 3*draBackgroundPerNode, c.backgroundLeft(), "background CPU pods left")

	claims := map[string]bool{}
	for _, p := range list() {
		claims[podClaimName(&p, testobj.GPURequestName)] = true
	}
	c.deleteJob("tmpl")
	c.eventually("the deleted pods' claims deleted", 60*time.Second, func() error {
		for name := range claims {
			if _, err := c.getClaim(c.ns, name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("claim %s still there (%v)", name, err)
			}
		}
		return nil
	})
}

// A Job of 4 × 8 nvidia.com/gpu on a pool mixing 2 DRA nodes (8-device
// slices, no nvidia.com/gpu allocatable) and 2 device-plugin nodes
// (allocatable nvidia.com/gpu: 8, no slice): the gang binds whole, one
// worker per node; the workers on DRA nodes have their extended resource
// allocated from their node's devices, those on device-plugin nodes have
// no claim.
func TestDRAMixedPool(t *testing.T) {
	dra := []*corev1.Node{draNode("dra-1"), draNode("dra-2")}
	plugin := []*corev1.Node{gpuNode("dp-1", 8).Rack("r1").Obj(), gpuNode("dp-2", 8).Rack("r1").Obj()}
	c := startDRACluster(t, dra, 8, plugin...)
	obs := c.observeGangs(map[string]int{"mnist": 4})
	c.createJob(jobSpec{name: "mnist", workers: 4, gpus: 8})
	pods := c.waitJobBound("mnist", 4)
	require.Len(t, nodesOf(pods), 4, "one 8-GPU worker per node: %v", nodesOf(pods))
	c.eventually("the workers on DRA nodes allocated 8 devices of their node, the others no claim", 30*time.Second, func() error {
		for _, p := range c.jobPods("mnist") {
			if strings.HasPrefix(p.Spec.NodeName, "dra-") {
				if err := c.extendedClaimAllocated(&p, 8); err != nil {
					return err
				}
			} else if p.Status.ExtendedResourceClaimStatus != nil {
				return fmt.Errorf("pod %s on device-plugin node %s has an extended-resource claim %+v", p.Name, p.Spec.NodeName, p.Status.ExtendedResourceClaimStatus)
			}
		}
		return nil
	})
	c.requireNoDeviceTwice()
	assert.Len(t, c.allocatedClaims(), 2, "claims allocated: one per worker on a DRA node")
	obs.check(t, 10*time.Second)
	assert.Equal(t, 4*draBackgroundPerNode, c.backgroundLeft(), "background CPU pods left")
}

// A low-priority Job gang of 4 × 8 nvidia.com/gpu fills 4 DRA nodes of 8
// devices; a high-priority gang of 4 × 8 comes. The low gang is evicted
// whole (each of its pods deleted, never some of it left running) and the
// high gang binds whole, each worker's claim allocated 8 devices of its
// node; the victims' claims are released (deallocated, then deleted with
// their pods), no device is allocated twice, and no background pod is
// evicted.
func TestDRAGangPreemption(t *testing.T) {
	c := startDRACluster(t, draNodes(4), 8)
	require.NoError(t, c.StartGarbageCollector())
	c.createPriorityClasses()
	k := c.startKubelet()

	c.createJob(jobSpec{name: "low", workers: 4, gpus: 8, mutate: withPriority("low")})
	lowPods := c.waitJobBound("low", 4)
	c.eachClaimAllocated("the low gang's claims allocated",
		func() []corev1.Pod { return c.jobPods("low") }, func(p *corev1.Pod) error { return c.extendedClaimAllocated(p, 8) })
	lowUIDs := map[types.UID]string{}
	victimClaims := map[string]bool{}
	for _, p := range c.jobPods("low") {
		lowUIDs[p.UID] = p.Name
		victimClaims[p.Status.ExtendedResourceClaimStatus.ResourceClaimName] = true
	}
	require.Len(t, lowUIDs, len(lowPods))

	obs := c.observeGangs(map[string]int{"low": 4, "high": 4})
	c.createJob(jobSpec{name: "high", workers: 4, gpus: 8, mutate: withPriority("high")})
	pods := c.waitJobBound("high", 4)
	require.Len(t, nodesOf(pods), 4, "one 8-GPU worker of the high gang per node: %v", nodesOf(pods))

	c.eventually("every pod of the low gang deleted", 30*time.Second, func() error {
		for uid, name := range lowUIDs {
			p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return err
			case p.UID == uid:
				return fmt.Errorf("low pod %s still there (node %q, deleting %v)", name, p.Spec.NodeName, p.DeletionTimestamp != nil)
			}
		}
		return nil
	})
	assert.Zero(t, c.liveBound("low"), "pods of the low gang running")
	removed := k.removedPods()
	var removedNames []string
	for name := range removed {
		removedNames = append(removedNames, name)
	}
	var lowNames []string
	for _, name := range lowUIDs {
		lowNames = append(lowNames, name)
	}
	assert.ElementsMatch(t, lowNames, removedNames, "pods evicted: exactly the low gang's")
	obs.check(t, 10*time.Second)

	c.eventually("every worker of the high gang allocated 8 devices of its node", 30*time.Second, func() error {
		for _, p := range c.jobPods("high") {
			if err := c.extendedClaimAllocated(&p, 8); err != nil {
				return err
			}
		}
		return nil
	})
	c.eventually("the victims' claims released", 60*time.Second, func() error {
		for name := range victimClaims {
			claim, err := c.getClaim(c.ns, name)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return err
			default:
				return fmt.Errorf("victim claim %s still there (allocated %v)", name, claim.Status.Allocation != nil)
			}
		}
		return nil
	})
	c.requireNoDeviceTwice()
	assert.Equal(t, 4*draBackgroundPerNode, c.backgroundLeft(), "background CPU pods left")
}

// A gang member whose claim an earlier attempt allocated on node-1 and
// reserved for it (the scheduler stopped between PreBind and the binding),
// and node-1 has since been cordoned: nothing can place the member where
// its claim is, and neither the ResourceClaim controller (the pod that
// holds the reservation is still pending) nor the DynamicResources
// PostFilter (its Filter never ran for a gang muster could not plan)
// releases the claim. muster releases it, as that PostFilter would, and
// the gang binds on node-2 and node-3, each claim allocated anew there.
func TestDRAEarlierAllocationOnACordonedNodeIsReleased(t *testing.T) {
	c := startDRACluster(t, draNodes(3), 1)
	obs := c.observeGangsBy(v1alpha1.PodGroupLabel, map[string]int{"workers": 2})
	c.createPodGroup("workers", 2, nil)
	for i := range 2 {
		_, err := c.Client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, testobj.GPUClaim(c.ns, fmt.Sprintf("worker-%d-gpu", i), 1), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// worker-0 waits at PreEnqueue for its sibling while its claim is
	// allocated, as PreBind would have done it.
	c.createClaimPod("workers", "worker-0", "worker-0-gpu")
	pod, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "worker-0", metav1.GetOptions{})
	require.NoError(t, err)
	claim, err := c.getClaim(c.ns, "worker-0-gpu")
	require.NoError(t, err)
	claim.Finalizers = append(claim.Finalizers, resourcev1.Finalizer)
	claim, err = c.Client.ResourceV1().ResourceClaims(c.ns).Update(c.ctx, claim, metav1.UpdateOptions{})
	require.NoError(t, err)
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
		{Request: testobj.GPURequestName, Driver: testobj.GPUDriver, Pool: "node-1", Device: "gpu-0"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}}}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	_, err = c.Client.ResourceV1().ResourceClaims(c.ns).UpdateStatus(c.ctx, claim, metav1.UpdateOptions{})
	require.NoError(t, err)
	node, err := c.Client.CoreV1().Nodes().Get(c.ctx, "node-1", metav1.GetOptions{})
	require.NoError(t, err)
	node.Spec.Unschedulable = true
	_, err = c.Client.CoreV1().Nodes().Update(c.ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)

	c.createClaimPod("workers", "worker-1", "worker-1-gpu")
	list := func() []corev1.Pod { return c.groupPods("workers") }
	pods := c.waitAllBound("members of workers", 2, list)
	assert.Equal(t, map[string]int{"node-2": 1, "node-3": 1}, nodesOf(pods))
	c.eachClaimAllocated("the claim of each member allocated 1 device of its node",
		list, func(p *corev1.Pod) error { return c.podClaimAllocated(p, 1) })
	c.requireNoDeviceTwice()
	obs.check(t, 10*time.Second)
}

// A member waits at Permit on its planned DRA node while its sibling's
// cycle is held; then the planned nodes' drivers take a device out of
// their ResourceSlices (an unhealthy GPU), or the slices are deleted. No
// Node changes, yet the plan is dropped at once, the waiting member
// released, and the gang placed on the other nodes, never on the changed
// ones, each member's devices allocated exactly.
func TestPlannedDRANodeLosesDevicesWhileMemberWaits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(c *cluster, node string)
	}{
		{"a device taken out", func(c *cluster, node string) {
			published, err := c.Client.ResourceV1().ResourceSlices().List(c.ctx, metav1.ListOptions{})
			require.NoError(c.t, err)
			for _, s := range published.Items {
				if s.Spec.NodeName != nil && *s.Spec.NodeName == node {
					s.Spec.Devices = s.Spec.Devices[:len(s.Spec.Devices)-1]
					_, err := c.Client.ResourceV1().ResourceSlices().Update(c.ctx, &s, metav1.UpdateOptions{})
					require.NoError(c.t, err)
				}
			}
		}},
		{"slice deleted", func(c *cluster, node string) {
			published, err := c.Client.ResourceV1().ResourceSlices().List(c.ctx, metav1.ListOptions{})
			require.NoError(c.t, err)
			for _, s := range published.Items {
				if s.Spec.NodeName != nil && *s.Spec.NodeName == node {
					require.NoError(c.t, c.Client.ResourceV1().ResourceSlices().Delete(c.ctx, s.Name, metav1.DeleteOptions{}))
				}
			}
		}},
		{"devices tainted NoExecute by their driver", func(c *cluster, node string) {
			published, err := c.Client.ResourceV1().ResourceSlices().List(c.ctx, metav1.ListOptions{})
			require.NoError(c.t, err)
			for _, s := range published.Items {
				if s.Spec.NodeName != nil && *s.Spec.NodeName == node {
					for i := range s.Spec.Devices {
						s.Spec.Devices[i].Taints = append(s.Spec.Devices[i].Taints, resourcev1.DeviceTaint{
							Key: "example.com/ecc", Value: "uncorrectable", Effect: resourcev1.DeviceTaintEffectNoExecute})
					}
					_, err := c.Client.ResourceV1().ResourceSlices().Update(c.ctx, &s, metav1.UpdateOptions{})
					require.NoError(c.t, err)
				}
			}
		}},
		{"devices tainted by a DeviceTaintRule", func(c *cluster, node string) {
			_, err := c.Client.ResourceV1().DeviceTaintRules().Create(c.ctx, &resourcev1.DeviceTaintRule{
				ObjectMeta: metav1.ObjectMeta{Name: "maintenance-" + node},
				Spec: resourcev1.DeviceTaintRuleSpec{
					DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To(testobj.GPUDriver), Pool: ptr.To(node)},
					Taint:          resourcev1.DeviceTaint{Key: "example.com/maintenance", Effect: resourcev1.DeviceTaintEffectNoSchedule},
				}}, metav1.CreateOptions{})
			require.NoError(c.t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ext := startHoldingExtender(t, 1) // the second member to come is held
			c := startDRAClusterWith(t, ext.Config(), draNodes(4), 8)
			c.createPodGroup("pair", 2, ptr.To[int32](600))
			c.createGroupPod("pair", "pair-0", 8, held)
			c.createGroupPod("pair", "pair-1", 8, held)
			waiting := c.waitOneAtPermit(ext)
			// Empty equal nodes tie: the plan takes the first two by name.
			planned := []string{"node-1", "node-2"}
			for _, node := range planned {
				tc.change(c, node)
			}
			c.waitForEvent("PodGroup", "pair", "GangRejected", "planned node")
			c.waitFor(waiting+" released", 30*time.Second, func() (bool, error) {
				p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, waiting, metav1.GetOptions{})
				return err == nil && p.Spec.NodeName == "" && unschedulableWith(p, "lost DRA devices"), err
			})
			ext.Release()
			list := func() []corev1.Pod { return c.groupPods("pair") }
			for _, p := range c.waitAllBound("members of pair", 2, list) {
				assert.NotContains(t, planned, p.Spec.NodeName, "pod %s bound to a node that lost devices under its plan", p.Name)
			}
			c.eachClaimAllocated("each member's extended resource allocated 8 devices of its node", list,
				func(p *corev1.Pod) error { return c.extendedClaimAllocated(p, 8) })
			c.requireNoDeviceTwice()
		})
	}
}
