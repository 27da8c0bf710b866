package sim

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// draSmall is a rack of 4 DRA nodes of 8 GPUs, 32 devices in all: a gang
// of 3x8 and one of 4x2 arrive together (32 GPUs, every device); a 2x8
// gang arrives while they run and must wait for the 3x8 gang's devices,
// which come free only when its claims are released.
const draSmall = `
name: dra-small
cluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4, dra: {}}
workload:
  podOrder: grouped
  waves:
  - {at: 0s, duration: 10m, gangs: [3x8]}
  - {at: 0s, duration: 20m, gangs: [4x2]}
  - {at: 1m, duration: 5m, gangs: [2x8]}
`

// On a DRA cluster every node advertises no GPU and publishes its devices;
// muster binds every gang whole, each GPU member with a claim of its GPUs
// on its node (checked after every step, checkDRA), no device twice, and
// the devices of finished gangs are released and allocated again. The
// default profile, through the same DynamicResources plugin, also ends
// with every claim released.
func TestDRAGangsBindWithDevices(t *testing.T) {
	plan := parsePlan(t, draSmall, 1)
	if plan.DRANodes() != 4 {
		t.Fatalf("%d DRA nodes, want all 4", plan.DRANodes())
	}
	for _, scheduler := range []string{Muster, Default} {
		t.Run(scheduler, func(t *testing.T) {
			h := startHarness(t, plan, scheduler)
			for _, n := range plan.Nodes {
				info, err := h.driver.sched.Cache.GetNode(n.Name)
				if err != nil {
					t.Fatal(err)
				}
				if gpus, ok := info.Node().Status.Allocatable[configv1.DefaultGPUResourceName]; ok {
					t.Errorf("DRA node %s advertises %s nvidia.com/gpu", n.Name, gpus.String())
				}
			}
			manager := h.driver.sched.Profiles[h.driver.b.schedulerName].SharedDRAManager()
			slices, err := manager.ResourceSlices().ListWithDeviceTaintRules()
			if err != nil || len(slices) != 4 {
				t.Fatalf("the scheduler's DRA manager has %d slices (%v), want 4", len(slices), err)
			}
			for _, s := range slices {
				if s.Spec.Driver != testobj.GPUDriver || s.Spec.NodeName == nil || s.Spec.Pool.Name != *s.Spec.NodeName || len(s.Spec.Devices) != 8 {
					t.Errorf("slice %s: driver %s, pool %s, %d devices; want 8 devices of %s in the node's pool", s.Name, s.Spec.Driver,
						s.Spec.Pool.Name, len(s.Spec.Devices), testobj.GPUDriver)
				}
			}
			runSteps(t, h)
			m, d, _, gangs := h.rec.Result()
			dra := h.cluster.draResult()
			t.Logf("DRA record %+v, %d steps, %.2fs busy", *dra, d.Steps, d.BusySeconds)
			if dra.ViolationCount > 0 {
				t.Fatalf("DRA checks broken: %v", dra.Violations)
			}
			if m.GangsCompleted != 3 || h.endReason != allFinished {
				t.Fatalf("%d of 3 gangs done (%s)", m.GangsCompleted, h.endReason)
			}
			// 3 + 4 + 2 GPU members, each bound once with a claim.
			if dra.ClaimsChecked != 9 || dra.ClaimsReleased != 9 || d.PodsBound != 9 {
				t.Errorf("%d bindings checked, %d claims released, %d pods bound; want 9 each", dra.ClaimsChecked, dra.ClaimsReleased, d.PodsBound)
			}
			if scheduler == Muster {
				if dra.PeakDevicesAllocated != 32 {
					t.Errorf("peak %d devices allocated, want all 32", dra.PeakDevicesAllocated)
				}
				if m.PartialGangs != 0 {
					t.Errorf("muster left %d gangs partly bound", m.PartialGangs)
				}
				// The 2x8 gang runs only after the 3x8 gang's claims are
				// released at 10m.
				for _, g := range gangs {
					if strings.Contains(g.Name, "-2x8") && g.Placed != 600 {
						t.Errorf("gang %s placed at %.0fs, want 600 (when the 3x8 gang's devices are released)", g.Name, g.Placed)
					}
				}
			}
			claims, err := h.cluster.dra.claims.List(labels.Everything())
			if err != nil || len(claims) != 0 {
				t.Errorf("%d claims left at the end (%v), want every one released", len(claims), err)
			}
			allocated, err := manager.ResourceClaims().ListAllAllocatedDevices()
			if err != nil || allocated.Len() != 0 {
				t.Errorf("the scheduler still counts %d devices allocated (%v)", allocated.Len(), err)
			}
		})
	}
}

// runSteps runs every step of the harness's plan.
func runSteps(t *testing.T, h *harness) {
	t.Helper()
	ctx := t.Context()
	if err := h.loop(ctx); err != nil {
		t.Fatal(err)
	}
}

// draShort has 4 DRA nodes of 8 GPUs and a gang of 5x8: its devices are
// short by one node. muster binds nothing and holds nothing (no claim, no
// device allocated or in flight); the default profile binds four members
// with their claims and leaves the gang partly bound.
const draShort = `
name: dra-short
horizon: 1h
cluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4, dra: {}}
workload: {waves: [{duration: 10m, gangs: [5x8]}]}
`

func TestDRAShortCapacityHoldsNothing(t *testing.T) {
	plan := parsePlan(t, draShort, 1)
	t.Run(Muster, func(t *testing.T) {
		h := startHarness(t, plan, Muster)
		runSteps(t, h)
		m, d, _, _ := h.rec.Result()
		if d.PodsBound != 0 || m.PartialGangs != 0 || m.GangsCompleted != 0 {
			t.Errorf("muster bound %d pods, %d partial gangs, %d done; want nothing bound", d.PodsBound, m.PartialGangs, m.GangsCompleted)
		}
		if n := len(h.driver.sched.SchedulingQueue.InFlightPods()); n != 0 {
			t.Errorf("%d pods in flight (held at Permit?)", n)
		}
		claims, err := h.cluster.dra.claims.List(labels.Everything())
		if err != nil || len(claims) != 0 {
			t.Errorf("%d claims (%v), want none", len(claims), err)
		}
		manager := h.driver.sched.Profiles[h.driver.b.schedulerName].SharedDRAManager()
		allocated, err := manager.ResourceClaims().ListAllAllocatedDevices()
		if err != nil || allocated.Len() != 0 {
			t.Errorf("%d devices allocated or in flight (%v), want none", allocated.Len(), err)
		}
		pods, err := h.cluster.dra.pods.Pods(namespace).List(labels.Everything())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if p.Spec.NodeName != "" || p.Status.ExtendedResourceClaimStatus != nil {
				t.Errorf("pod %s on %q with claim status %v", p.Name, p.Spec.NodeName, p.Status.ExtendedResourceClaimStatus)
			}
		}
		if dra := h.cluster.draResult(); dra.ViolationCount > 0 || dra.ClaimsChecked != 0 {
			t.Errorf("DRA record %+v; want no binding and no broken check", dra)
		}
	})
	t.Run(Default, func(t *testing.T) {
		h := startHarness(t, plan, Default)
		runSteps(t, h)
		m, d, _, _ := h.rec.Result()
		if d.PodsBound != 4 || m.DeadlockedGangs != 1 {
			t.Errorf("default bound %d pods, %d deadlocked gangs; want 4 members bound and the gang stuck partly bound", d.PodsBound, m.DeadlockedGangs)
		}
		dra := h.cluster.draResult()
		if dra.ViolationCount > 0 || dra.ClaimsChecked != 4 || dra.PeakDevicesAllocated != 32 {
			t.Errorf("DRA record %+v; want 4 claims checked and all 32 devices allocated", dra)
		}
	})
}

// A mixed cluster: half the nodes serve GPUs by DRA, half by the device
// plugin. A gang of 4x8 needs every node, so it spans both kinds: members
// on DRA nodes get claims, the others none (checkDRA checks both).
const draMixed = `
name: dra-mixed
cluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4, dra: {fraction: 0.5}}
workload: {waves: [{duration: 10m, gangs: [4x8, 4x1]}]}
`

func TestDRAMixedCluster(t *testing.T) {
	plan := parsePlan(t, draMixed, 1)
	if plan.DRANodes() != 2 {
		t.Fatalf("%d DRA nodes, want 2 of 4", plan.DRANodes())
	}
	h := startHarness(t, plan, Muster)
	for _, n := range plan.Nodes {
		info, err := h.driver.sched.Cache.GetNode(n.Name)
		if err != nil {
			t.Fatal(err)
		}
		_, advertised := info.Node().Status.Allocatable[configv1.DefaultGPUResourceName]
		if advertised == n.DRA {
			t.Errorf("node %s (DRA %t) advertises nvidia.com/gpu: %t", n.Name, n.DRA, advertised)
		}
	}
	runSteps(t, h)
	m, _, _, _ := h.rec.Result()
	dra := h.cluster.draResult()
	if m.GangsCompleted != 2 || dra.ViolationCount > 0 {
		t.Fatalf("%d of 2 gangs done (%s); DRA checks broken: %v", m.GangsCompleted, h.endReason, dra.Violations)
	}
	// The 4x8 gang has one member per node: two on DRA nodes. The 4x1
	// gang waits for it to finish and may land on either kind.
	if dra.ClaimsChecked < 2 || dra.ClaimsReleased != dra.ClaimsChecked {
		t.Errorf("%d bindings to DRA nodes checked, %d claims released; want at least the 4x8 gang's 2, all released", dra.ClaimsChecked, dra.ClaimsReleased)
	}
}

// The none scheduler binds pods itself and cannot run a DRA cluster.
func TestNoneRefusesDRA(t *testing.T) {
	waits := newPauser()
	defer waits.close()
	_, err := newHarness(t.Context(), Options{Plan: parsePlan(t, draShort, 1), Scheduler: None}, waits)
	if err == nil || !strings.Contains(err.Error(), "cluster.dra") {
		t.Errorf("none on a DRA cluster: %v, want a refusal naming cluster.dra", err)
	}
}

// cachedClaims is a scheduler's claim cache holding the named claims; only
// Get is answered.
type cachedClaims struct {
	fwk.ResourceClaimTracker
	names map[string]bool
}

func (c cachedClaims) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	if c.names[namespace+"/"+name] {
		return &resourceapi.ResourceClaim{}, nil
	}
	return nil, apierrors.NewNotFound(claimsResource.GroupResource(), name)
}

type draManagerWith struct {
	fwk.SharedDRAManager
	claims cachedClaims
}

func (m draManagerWith) ResourceClaims() fwk.ResourceClaimTracker { return m.claims }

// A deleted claim holds the step until the scheduler's claim cache has
// dropped it too: the informer delivering the deletion to the simulator's
// counters says nothing of the scheduler's own handler. Deletions are
// confirmed in order and each only once.
func TestClaimDeletionWaitsForTheSchedulersClaimCache(t *testing.T) {
	cached := map[string]bool{"sim/b": true, "sim/c": true}
	d := newDRACluster(1)
	if why := d.unconfirmedClaimDelete(); why != "" {
		t.Fatalf("nothing deleted: %q", why)
	}
	d.manager = draManagerWith{claims: cachedClaims{names: cached}}
	for _, name := range []string{"a", "b", "c"} {
		d.deleted = append(d.deleted, types.NamespacedName{Namespace: namespace, Name: name})
	}
	if why := d.unconfirmedClaimDelete(); !strings.Contains(why, "sim/b") {
		t.Errorf("b still cached: %q, want it named", why)
	}
	if len(d.deleted) != 2 {
		t.Errorf("%d deletions left to confirm, want 2 (a confirmed)", len(d.deleted))
	}
	delete(cached, "sim/b")
	if why := d.unconfirmedClaimDelete(); !strings.Contains(why, "sim/c") {
		t.Errorf("c still cached: %q, want it named", why)
	}
	delete(cached, "sim/c")
	if why := d.unconfirmedClaimDelete(); why != "" || len(d.deleted) != 0 {
		t.Errorf("every deletion taken in: %q, %d left", why, len(d.deleted))
	}
	var none *draCluster
	if why := none.unconfirmedClaimDelete(); why != "" {
		t.Errorf("a cluster without DRA: %q", why)
	}
}
