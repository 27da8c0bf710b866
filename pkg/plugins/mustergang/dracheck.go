package mustergang

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/structured"
)

// draCheck is a plan's per-trial view of DRA devices. The DynamicResources
// plugin has no PreFilterExtensions: a member's Filter does not see the
// devices given to members placed before it in the same trial, and would
// confirm two members on one device. So for a member that needs devices on
// a node, the check also allocates them with the plugin's own allocator
// (k8s.io/dynamic-resource-allocation/structured, the same classes, slices
// and allocated devices the plugin's PreFilter reads from the framework's
// SharedDRAManager) with the trial's devices taken; Place takes them.
//
// In a preemption dry run the victims' devices are free in this view;
// the plugin itself cannot see them free, so its refusal gives way to this
// view there (see filterCheck.draOverrides).
type draCheck struct {
	d *draGPUs
	// allocated is what the plugin's PreFilter counts as allocated
	// (allocated and in-flight claims), without the victims' devices.
	allocated *structured.AllocatedState
	// slices are the ResourceSlices by node ("" holds the slices that
	// are not one node's: every node may use them).
	slices map[string][]*resourceapi.ResourceSlice
	// onNode is allocated restricted to each node's devices, built once
	// per node.
	onNode map[string]sets.Set[structured.DeviceID]
	// claims are each member's ResourceClaims still to allocate.
	claims map[types.UID][]*resourceapi.ResourceClaim
	// pinned are, per member, its claims already allocated (or in flight)
	// whose devices only some nodes can use.
	pinned map[types.UID][]pinnedClaim
	// freed reports that victims' devices were taken out of allocated.
	freed bool
}

func (d *draGPUs) newDRACheck(ctx context.Context, victims []*v1.Pod) (*draCheck, error) {
	state, err := d.allocatedState(ctx)
	if err != nil {
		return nil, err
	}
	c := &draCheck{d: d, allocated: state, slices: d.slicesByNode(),
		onNode: map[string]sets.Set[structured.DeviceID]{}, claims: map[types.UID][]*resourceapi.ResourceClaim{},
		pinned: map[types.UID][]pinnedClaim{}}
	c.free(victims)
	return c, nil
}

// free takes the devices of the victims' claims out of the allocated
// devices: claims reserved for victims only, which their deletion releases.
func (c *draCheck) free(victims []*v1.Pod) {
	if len(victims) == 0 {
		return
	}
	gone := sets.New[types.UID]()
	for _, v := range victims {
		gone.Insert(v.UID)
	}
	for _, v := range victims {
		claims := c.d.podClaims(v)
		if s := v.Status.ExtendedResourceClaimStatus; s != nil {
			if claim, err := c.d.manager.ResourceClaims().Get(v.Namespace, s.ResourceClaimName); err == nil {
				claims = append(claims, claim)
			}
		}
		for _, claim := range claims {
			if claim.Status.Allocation == nil || !reservedOnlyFor(claim, gone) {
				continue
			}
			if !c.freed {
				c.allocated = &structured.AllocatedState{AllocatedDevices: c.allocated.AllocatedDevices.Clone(),
					AllocatedSharedDeviceIDs: c.allocated.AllocatedSharedDeviceIDs, AggregatedCapacity: c.allocated.AggregatedCapacity}
				c.freed = true
			}
			for _, r := range claim.Status.Allocation.Devices.Results {
				c.allocated.AllocatedDevices.Delete(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
			}
		}
	}
}

func reservedOnlyFor(claim *resourceapi.ResourceClaim, pods sets.Set[types.UID]) bool {
	for _, r := range claim.Status.ReservedFor {
		if !pods.Has(r.UID) {
			return false
		}
	}
	return true
}

// toAllocate is what member must have allocated on node: its claims not yet
// allocated (nor in flight, nor allocated earlier in this trial) and the
// claim for its extended resources when node serves them by DRA.
//
// A claim already allocated, or allocated earlier in this trial (one
// several members share), is not allocated again; its allocation must be
// available on node. DynamicResources says so for the first kind, except
// where a preemption dry run overrides it (filterCheck.draOverrides).
func (c *draCheck) toAllocate(pod *v1.Pod, node *v1.Node, extended *resourceapi.ResourceClaim, trialClaims map[types.UID]*v1.NodeSelector) ([]*resourceapi.ResourceClaim, error) {
	claims, seen := c.claims[pod.UID]
	if !seen {
		var pinned []pinnedClaim
		for _, claim := range c.d.podClaims(pod) {
			allocation := claim.Status.Allocation
			if allocation == nil {
				allocation = c.d.manager.ResourceClaims().GetPendingAllocation(claim.UID)
			}
			if allocation == nil {
				claims = append(claims, claim)
				continue
			}
			if allocation.NodeSelector != nil {
				nodes, err := nodeaffinity.NewNodeSelector(allocation.NodeSelector)
				if err != nil {
					return nil, err
				}
				pinned = append(pinned, pinnedClaim{name: claim.Name, nodes: nodes})
			}
		}
		c.claims[pod.UID], c.pinned[pod.UID] = claims, pinned
	}
	for _, p := range c.pinned[pod.UID] {
		if !p.nodes.Match(node) {
			return nil, fmt.Errorf("its ResourceClaim %s is allocated on a node whose devices this node cannot use", p.name)
		}
	}
	var out []*resourceapi.ResourceClaim
	for _, claim := range claims {
		selector, inTrial := trialClaims[claim.UID]
		if !inTrial {
			out = append(out, claim)
			continue
		}
		if selector != nil {
			matches, err := nodeaffinity.NewNodeSelector(selector)
			if err != nil {
				return nil, err
			}
			if !matches.Match(node) {
				return nil, fmt.Errorf("its ResourceClaim %s is allocated for another member on a node whose devices this node cannot use", claim.Name)
			}
		}
	}
	if extended != nil {
		out = append(out, extended)
	}
	return out, nil
}

// pinnedClaim is a member's claim already allocated where only the nodes
// its allocation's node selector matches can use its devices.
type pinnedClaim struct {
	name  string
	nodes *nodeaffinity.NodeSelector
}

// sharesTrialClaim reports whether one of pod's claims (toAllocate read
// them) was allocated for an earlier member in this trial.
func (c *draCheck) sharesTrialClaim(pod *v1.Pod, trialClaims map[types.UID]*v1.NodeSelector) bool {
	for _, claim := range c.claims[pod.UID] {
		if _, ok := trialClaims[claim.UID]; ok {
			return true
		}
	}
	return false
}

// allocatedOn is allocated restricted to the devices node may use.
func (c *draCheck) allocatedOn(node string) sets.Set[structured.DeviceID] {
	if s, ok := c.onNode[node]; ok {
		return s
	}
	s := sets.New[structured.DeviceID]()
	for _, slices := range [][]*resourceapi.ResourceSlice{c.slices[node], c.slices[""]} {
		for _, slice := range slices {
			for i := range slice.Spec.Devices {
				id := structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, slice.Spec.Devices[i].Name)
				if c.allocated.AllocatedDevices.Has(id) {
					s.Insert(id)
				}
			}
		}
	}
	c.onNode[node] = s
	return s
}

// allocate allocates claims on node with the trial's devices taken and
// returns the devices it chose; an error says why nothing fits.
func (c *draCheck) allocate(ctx context.Context, node *v1.Node, claims []*resourceapi.ResourceClaim, taken sets.Set[structured.DeviceID]) ([]structured.DeviceID, []resourceapi.AllocationResult, error) {
	allocated := c.allocatedOn(node.Name)
	if taken.Len() > 0 {
		allocated = allocated.Union(taken)
	}
	slices := append(append([]*resourceapi.ResourceSlice(nil), c.slices[node.Name]...), c.slices[""]...)
	state := structured.AllocatedState{AllocatedDevices: allocated,
		AllocatedSharedDeviceIDs: c.allocated.AllocatedSharedDeviceIDs, AggregatedCapacity: c.allocated.AggregatedCapacity}
	allocator, err := structured.NewAllocator(ctx, c.d.features, state, c.d.manager.DeviceClasses(), slices, c.d.cel)
	if err != nil {
		return nil, nil, err
	}
	results, err := allocator.Allocate(ctx, node, claims)
	if err != nil {
		return nil, nil, err
	}
	if len(results) != len(claims) {
		if taken.Len() > 0 {
			return nil, nil, fmt.Errorf("the devices left after the members placed before it do not satisfy its ResourceClaims")
		}
		return nil, nil, fmt.Errorf("the node's devices do not satisfy its ResourceClaims")
	}
	var ids []structured.DeviceID
	for _, r := range results {
		for _, d := range r.Devices.Results {
			ids = append(ids, structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
		}
	}
	return ids, results, nil
}
