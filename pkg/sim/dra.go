package sim

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/sim/measure"
)

// Dynamic resource allocation (scenario.DRA) in the fake cluster.
//
// A DRA node has no nvidia.com/gpu in its allocatable; its GPUs are the
// devices of one ResourceSlice (testobj.GPUSlice: driver gpu.nvidia.com,
// pool named after the node), and the DeviceClass gpu.nvidia.com
// (testobj.GPUDeviceClass) backs the extended resource nvidia.com/gpu. The
// slices and the class go into the tracker with the nodes, before the
// informers start. The workers' pods are unchanged: kube-scheduler's
// DynamicResources plugin, in every profile, allocates a GPU worker's
// devices on a DRA node and at PreBind creates a ResourceClaim for them
// (owned by the pod, named <pod>-extended-resources-<suffix>), records it
// in the pod's status.extendedResourceClaimStatus and reserves it for the
// pod.
//
// What the fake clientset lacks, the simulator supplies:
//
//   - ResourceClaim writes go through a tracker wrapper (claimTracker) that
//     gives each written claim a new resourceVersion (the scheduler's assume
//     cache ignores claims without one and orders versions by it), refuses
//     an update of a stale version as the API server does, and names a
//     claim created with generateName.
//   - The ResourceClaim controller and the garbage collector: when a pod
//     that owns claims is deleted (finished, evicted, restarted, or lost
//     with its node), the simulator deletes its claims, which frees their
//     devices. The deletion is counted like every other change, so a step
//     is not settled before the scheduler has seen the devices freed.
//   - A reclaimed spot node's ResourceSlice is deleted with it, and its
//     replacement publishes one of its own.
//
// After every step the simulator checks what DRA must hold (checkDRA,
// measure.DRA); a run that breaks a check fails.

// claimsResource is resource.k8s.io/v1 resourceclaims.
var claimsResource = resourceapi.SchemeGroupVersion.WithResource("resourceclaims")

// slowBinding is how long after its claim was created a binding counts as
// slow: DynamicResources' PreBind polls its assume cache once a second.
const slowBinding = 500 * time.Millisecond

// maxViolations is how many broken checks a run keeps the text of.
const maxViolations = 20

// draCluster is the cluster model's record of DRA. Its maps are written under
// the fake's lock (the tracker wrapper, the delete reactor) and read from
// informer handlers, so they have a lock of their own.
type draCluster struct {
	mu sync.Mutex
	// owned: pod UID → the claims it owns (by name, namespace sim).
	owned map[types.UID][]string
	// releasing: pods deleted whose claims are still to be deleted.
	releasing map[types.UID]bool
	// created: pod name → when its first owned claim was created.
	created map[string]time.Time
	// generated numbers the claims created with generateName.
	generated int

	// manager is the scheduler's DRA manager (awaitClaim).
	manager fwk.SharedDRAManager
	pods    corelisters.PodLister
	claims  resourcelisters.ResourceClaimLister
	// deleted: claims deleted whose deletion the scheduler's claim cache
	// has not been seen to take in yet (unconfirmedClaimDelete).
	deleted []types.NamespacedName
	// checked reads the bindings, each checked once.
	checked *bindReader
	stats   measure.DRA
}

func newDRACluster(nodes int) *draCluster {
	return &draCluster{owned: map[types.UID][]string{}, releasing: map[types.UID]bool{}, created: map[string]time.Time{},
		stats: measure.DRA{Nodes: nodes}}
}

// addDRA puts the DeviceClass and each DRA node's ResourceSlice into the
// tracker, before the informers start, and routes ResourceClaim writes
// through the claim tracker.
func (c *cluster) addDRA() error {
	if c.dra == nil {
		return nil
	}
	c.cs.PrependReactor("*", "resourceclaims", k8stesting.ObjectReaction(&claimTracker{ObjectTracker: c.cs.Tracker(), c: c}))
	if err := c.cs.Tracker().Add(versioned(c.resourceVersion, testobj.GPUDeviceClass())); err != nil {
		return err
	}
	slices := 0
	for _, n := range c.plan.Nodes {
		if !n.DRA {
			continue
		}
		if err := c.cs.Tracker().Add(versioned(c.resourceVersion, testobj.GPUSlice(n.Name, int(n.GPUs)))); err != nil {
			return err
		}
		slices++
	}
	// The initial list delivers them as adds: wait for those too.
	c.counts.wanted[kindSliceAdd].Add(int64(slices))
	return nil
}

// watchDRA adds the claim controller and the listers the checks read to
// the scheduler's informers (before they start).
func (c *cluster) watchDRA(factory informers.SharedInformerFactory) error {
	if c.dra == nil {
		return nil
	}
	c.dra.pods = factory.Core().V1().Pods().Lister()
	c.dra.claims = factory.Resource().V1().ResourceClaims().Lister()
	_, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: c.releaseClaims})
	return err
}

// claimTracker is the fake's object tracker for ResourceClaims with what
// the API server would add: a resourceVersion per write, optimistic
// concurrency on updates, generated names. It counts each write whose
// event the scheduler's informers must deliver, and records which pod owns
// which claim. It runs under the fake's lock.
type claimTracker struct {
	k8stesting.ObjectTracker
	c *cluster
}

func (t *claimTracker) Create(gvr schema.GroupVersionResource, obj kruntime.Object, ns string, opts ...metav1.CreateOptions) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	d := t.c.dra
	if m.GetName() == "" && m.GetGenerateName() != "" {
		d.mu.Lock()
		d.generated++
		m.SetName(fmt.Sprintf("%s%05d", m.GetGenerateName(), d.generated))
		d.mu.Unlock()
	}
	if m.GetUID() == "" {
		m.SetUID(types.UID("claim-" + ns + "-" + m.GetName()))
	}
	versioned(t.c.resourceVersion, m)
	t.c.counts.want(kindClaimAdd)
	if err := t.ObjectTracker.Create(gvr, obj, ns, opts...); err != nil {
		t.c.counts.wanted[kindClaimAdd].Add(-1)
		return err
	}
	d.mu.Lock()
	for _, o := range m.GetOwnerReferences() {
		if o.Kind == "Pod" {
			d.owned[o.UID] = append(d.owned[o.UID], m.GetName())
			if _, ok := d.created[o.Name]; !ok {
				d.created[o.Name] = time.Now()
			}
		}
	}
	d.mu.Unlock()
	d.awaitClaim(ns, m.GetName())
	return nil
}

// claimDelivery bounds how long a claim's creation waits for the
// scheduler's claim cache to have it.
const claimDelivery = 5 * time.Second

// awaitClaim returns once the scheduler's claim cache has the claim just
// created. The fake answers a create in microseconds, before its informers
// have delivered the claim, and DynamicResources' PreBind, which creates a
// pod's extended-resource claim and then waits for its own cache to have
// it, polls once a second: every binding on a DRA node would wait a whole
// second. Against an API server the claim's watch event usually comes
// before PreBind's next two round trips are done (it updates the claim's
// finalizer and status in between). Waiting here, under the fake's lock,
// stands for that latency. The claim informer's handlers call no API, so
// they deliver meanwhile.
func (d *draCluster) awaitClaim(ns, name string) {
	d.mu.Lock()
	manager := d.manager
	d.mu.Unlock()
	if manager == nil {
		return
	}
	deadline := time.Now().Add(claimDelivery)
	for i := 0; ; i++ {
		if _, err := manager.ResourceClaims().Get(ns, name); err == nil || time.Now().After(deadline) {
			return
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

func (t *claimTracker) Update(gvr schema.GroupVersionResource, obj kruntime.Object, ns string, opts ...metav1.UpdateOptions) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	stored, err := t.ObjectTracker.Get(gvr, ns, m.GetName())
	if err != nil {
		return err
	}
	sm, err := meta.Accessor(stored)
	if err != nil {
		return err
	}
	if rv := m.GetResourceVersion(); rv != "" && rv != sm.GetResourceVersion() {
		return apierrors.NewConflict(gvr.GroupResource(), m.GetName(),
			fmt.Errorf("the object has been modified (resourceVersion %s, stored %s)", rv, sm.GetResourceVersion()))
	}
	return t.write(m, func() error { return t.ObjectTracker.Update(gvr, obj, ns, opts...) })
}

func (t *claimTracker) Patch(gvr schema.GroupVersionResource, obj kruntime.Object, ns string, opts ...metav1.PatchOptions) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	return t.write(m, func() error { return t.ObjectTracker.Patch(gvr, obj, ns, opts...) })
}

// write stores an update under a new resourceVersion.
func (t *claimTracker) write(m metav1.Object, store func() error) error {
	versioned(t.c.resourceVersion, m)
	t.c.counts.want(kindClaimUpdate)
	if err := store(); err != nil {
		t.c.counts.wanted[kindClaimUpdate].Add(-1)
		return err
	}
	return nil
}

func (t *claimTracker) Delete(gvr schema.GroupVersionResource, ns, name string, opts ...metav1.DeleteOptions) error {
	obj, err := t.ObjectTracker.Get(gvr, ns, name)
	if err != nil {
		return err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	t.c.counts.want(kindClaimDelete)
	if err := t.ObjectTracker.Delete(gvr, ns, name, opts...); err != nil {
		t.c.counts.wanted[kindClaimDelete].Add(-1)
		return err
	}
	d := t.c.dra
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deleted = append(d.deleted, types.NamespacedName{Namespace: ns, Name: name})
	for _, o := range m.GetOwnerReferences() {
		if o.Kind != "Pod" {
			continue
		}
		names := d.owned[o.UID]
		for i, n := range names {
			if n == name {
				names = append(names[:i:i], names[i+1:]...)
				break
			}
		}
		if len(names) == 0 {
			delete(d.owned, o.UID)
		} else {
			d.owned[o.UID] = names
		}
	}
	return nil
}

// unconfirmedClaimDelete names a deleted claim that the scheduler's claim
// cache still holds, "" when it has taken in every deletion so far. The
// counters only say that an informer delivered the deletion: the scheduler's
// claim cache is another handler of that informer and may run a while later,
// and only once it has run are the claim's devices free to the scheduler and
// the pods waiting for them moved in its queue. Confirmed deletions are
// dropped; nil-safe for a cluster without DRA.
func (d *draCluster) unconfirmedClaimDelete() string {
	if d == nil {
		return ""
	}
	d.mu.Lock()
	manager, deleted := d.manager, d.deleted
	d.mu.Unlock()
	if manager == nil {
		return ""
	}
	confirmed := 0
	for _, claim := range deleted {
		if _, err := manager.ResourceClaims().Get(claim.Namespace, claim.Name); err == nil {
			break
		}
		confirmed++
	}
	d.mu.Lock()
	d.deleted = d.deleted[confirmed:]
	d.mu.Unlock()
	if confirmed < len(deleted) {
		return "deleted claim " + deleted[confirmed].String() + " still in the scheduler's claim cache"
	}
	return ""
}

// podDeleting is told of every pod deletion before the tracker applies it
// (under the fake's lock): a pod that owns claims will have them released
// once its deletion is delivered (releaseClaims), and the step waits for it.
func (d *draCluster) podDeleting(counts *counters, pod *v1.Pod) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.created, pod.Name)
	if len(d.owned[pod.UID]) > 0 && !d.releasing[pod.UID] {
		d.releasing[pod.UID] = true
		counts.want(kindClaimRelease)
	}
}

// releaseClaims is the ResourceClaim controller and the garbage collector
// for a deleted pod: the claims it owns are deleted, which frees their
// devices (the fake's delete ignores the claims' finalizer, which the
// controller would remove after deallocating).
func (c *cluster) releaseClaims(obj interface{}) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	d := c.dra
	d.mu.Lock()
	if !d.releasing[pod.UID] {
		d.mu.Unlock()
		return
	}
	delete(d.releasing, pod.UID)
	names := append([]string(nil), d.owned[pod.UID]...)
	d.mu.Unlock()
	for _, name := range names {
		err := c.cs.ResourceV1().ResourceClaims(pod.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		switch {
		case err == nil:
			d.mu.Lock()
			d.stats.ClaimsReleased++
			d.mu.Unlock()
		case !apierrors.IsNotFound(err):
			d.violation("releasing claim %s of deleted pod %s: %v", name, pod.Name, err)
		}
	}
	c.counts.seen[kindClaimRelease].Add(1)
}

// bound notes a binding (under the fake's lock): one that came long after
// the pod's claim was created waited in PreBind.
func (d *draCluster) bound(pod string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if created, ok := d.created[pod]; ok {
		if at.Sub(created) >= slowBinding {
			d.stats.SlowBindings++
		}
		delete(d.created, pod)
	}
}

func (d *draCluster) violation(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.ViolationCount++
	if len(d.stats.Violations) < maxViolations {
		d.stats.Violations = append(d.stats.Violations, fmt.Sprintf(format, args...))
	}
}

// deleteSlice deletes a reclaimed DRA node's ResourceSlice, as the
// kubelet's plugin registration cleanup does when its node goes.
func (c *cluster) deleteSlice(ctx context.Context, node string) error {
	c.counts.want(kindSliceDelete)
	return c.cs.ResourceV1().ResourceSlices().Delete(ctx, testobj.GPUSlice(node, 0).Name, metav1.DeleteOptions{})
}

// createSlice publishes a new DRA node's GPUs.
func (c *cluster) createSlice(ctx context.Context, node string, gpus int64) error {
	c.counts.want(kindSliceAdd)
	_, err := c.cs.ResourceV1().ResourceSlices().Create(ctx, versioned(c.resourceVersion, testobj.GPUSlice(node, int(gpus))), metav1.CreateOptions{})
	return err
}
