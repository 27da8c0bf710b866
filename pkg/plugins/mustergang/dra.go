package mustergang

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/gang"
)

// draGPUs counts the GPUs dynamic resource allocation serves: the devices
// of the GPU DeviceClasses (every class whose extendedResourceName is the
// GPU resource, and the classes args.gpuDeviceClasses names) in the
// ResourceSlices of each node. Everything is read from the framework's own
// SharedDRAManager, the state the DynamicResources plugin allocates from
// (slices, allocated and in-flight devices), never from a second informer.
//
// The planner, Filter and the preemption search count a node's GPUs as
// the device-plugin GPUs (allocatable minus requested) plus the free DRA
// devices of the GPU classes; on a node with both, the plan's dry run
// offers each request only the pool that serves it (dryRunMember.screen).
// A member's GPUs are its extended-resource request (served by either
// path) plus the devices its unallocated ResourceClaims ask for in GPU
// classes.
type draGPUs struct {
	manager fwk.SharedDRAManager // nil: DRA is off in this scheduler
	gpu     v1.ResourceName
	named   sets.Set[string] // args.GPUDeviceClasses

	features structured.Features
	cel      *cel.Cache

	mu sync.Mutex
	// slices keeps each ResourceSlice's GPU devices, recomputed when the
	// slice's generation or the GPU classes change: matching a device
	// against a class's CEL selectors costs microseconds, and a cluster has
	// tens of thousands of devices.
	slices   map[string]*sliceGPUs // by slice name
	classKey string                // the GPU classes and selectors slices were matched with
	pass     uint64                // index calls, to find slices that are gone
	// byNode are the slices by node ("" for those that are no one node's),
	// rebuilt when a slice comes, goes or changes; never written after.
	byNode map[string][]*resourceapi.ResourceSlice
	// attributes are the device attributes topology levels are named by;
	// domains[attribute][node] their values, rebuilt with byNode, and
	// version counts the rebuilds.
	attributes []string
	domains    map[string]map[string]string
	version    int64
	// counted is the GPU devices of the current slices, counted when the
	// slices are indexed, so that a snapshot subtracts the allocated
	// devices instead of testing each device of the cluster.
	counted countedGPUs
}

// countedGPUs are the GPU devices of the pools the allocator takes from
// (markCurrentPools): by node those that take one allocation each, and the
// slices whose devices may take several (tested device by device).
type countedGPUs struct {
	perNode     map[string]int64
	node        map[structured.DeviceID]string
	total       int64
	shareable   []*sliceGPUs
	generations int64 // the slices' generations, for draState.version
	partitioned bool  // a slice defines or consumes shared counters
}

// count fills counted from the current slices. d.mu is held.
func (d *draGPUs) count() {
	c := countedGPUs{perNode: map[string]int64{}, node: map[structured.DeviceID]string{}}
	for _, sg := range d.slices {
		if !sg.current {
			continue
		}
		c.generations += sg.slice.Generation << 20
		c.partitioned = c.partitioned || sg.counters
		if len(sg.shareable) > 0 {
			c.shareable = append(c.shareable, sg)
			continue
		}
		for _, id := range sg.devices {
			node := sg.nodeOf(id)
			c.perNode[node]++
			c.node[id] = node
			c.total++
		}
	}
	d.counted = c
}

type sliceGPUs struct {
	slice   *resourceapi.ResourceSlice
	node    string
	devices []structured.DeviceID // the slice's devices in GPU classes
	// deviceNodes, for a slice that selects nodes per device, is each
	// GPU device's node (nodeOf); its GPUs for several nodes are no node's.
	deviceNodes map[structured.DeviceID]string
	// shareable are those of devices that allow multiple allocations
	// (while DRAConsumableCapacity is on): free while one more share fits.
	shareable map[structured.DeviceID]*resourceapi.Device
	counters  bool   // it defines or consumes shared counters
	current   bool   // the allocator takes devices from it (markCurrentPools)
	seen      uint64 // the last index pass that listed it
}

// draPool names a pool of devices: its slices share it.
type draPool struct{ driver, pool string }

func poolOf(s *resourceapi.ResourceSlice) draPool { return draPool{s.Spec.Driver, s.Spec.Pool.Name} }

// index brings slices and byNode up to date with the listed slices; only
// new or changed slices are matched against the GPU classes, all of them
// when a GPU class changed. It returns how many GPU classes exist. d.mu is
// held.
func (d *draGPUs) index(ctx context.Context, slices []*resourceapi.ResourceSlice) int {
	gpuClasses, key := d.gpuClasses(ctx)
	if key != d.classKey {
		d.slices, d.classKey = map[string]*sliceGPUs{}, key
	}
	d.pass++
	changed := d.byNode == nil
	for _, s := range slices {
		c := d.slices[s.Name]
		// A slice changes by a new object: the informer's on an update,
		// the tracker's when a DeviceTaintRule patches its devices (the
		// generation stays).
		if c == nil || c.slice != s {
			c = &sliceGPUs{slice: s}
			if s.Spec.NodeName != nil {
				c.node = *s.Spec.NodeName
			}
			// Network-attached devices (for several nodes) are no node's GPUs.
			switch {
			case c.node != "":
				c.devices = d.matchGPUs(ctx, s, gpuClasses)
			case ptr.Deref(s.Spec.PerDeviceNodeSelection, false):
				c.devices, c.deviceNodes = d.nodeLocalGPUs(ctx, s, gpuClasses)
			}
			c.shareable = d.shareableGPUs(s, c.devices)
			c.counters = len(s.Spec.SharedCounters) > 0 || anyConsumesCounters(s.Spec.Devices)
			d.slices[s.Name] = c
			changed = true
		}
		c.slice, c.seen = s, d.pass
	}
	if len(d.slices) != len(slices) {
		for name, c := range d.slices {
			if c.seen != d.pass {
				delete(d.slices, name)
			}
		}
		changed = true
	}
	if changed {
		byNode := make(map[string][]*resourceapi.ResourceSlice, len(d.slices))
		for _, c := range d.slices {
			byNode[c.node] = append(byNode[c.node], c.slice)
		}
		d.byNode = byNode
		d.domains = d.attributeDomains(byNode)
		d.version++
		d.markCurrentPools()
		d.count()
	}
	return len(gpuClasses)
}

// markCurrentPools marks the slices the allocator takes devices from: those
// of each pool's newest generation, when the pool is complete (it has as
// many of them as its resourceSliceCount says). While a driver republishes
// a pool, or before all of a pool's slices arrived, the allocator refuses
// the pool's devices (GatherPools in k8s.io/dynamic-resource-allocation/structured):
// they are no free GPUs. A slice the allocator ignores leaves its pool
// incomplete (ignoredByAllocator). d.mu is held.
func (d *draGPUs) markCurrentPools() {
	type poolState struct{ generation, slices, want int64 }
	pools := map[draPool]*poolState{}
	for _, c := range d.slices {
		spec := c.slice.Spec
		if d.ignoredByAllocator(c.slice) {
			continue
		}
		p, gen := pools[poolOf(c.slice)], spec.Pool.Generation
		switch {
		case p == nil || gen > p.generation:
			pools[poolOf(c.slice)] = &poolState{generation: gen, slices: 1, want: spec.Pool.ResourceSliceCount}
		case gen == p.generation:
			p.slices++
		}
	}
	for _, c := range d.slices {
		p := pools[poolOf(c.slice)]
		c.current = p != nil && c.slice.Spec.Pool.Generation == p.generation && p.slices == p.want
	}
}

// ignoredByAllocator reports whether the allocator passes over slice, as
// GatherPools in k8s.io/dynamic-resource-allocation/structured does: one
// that defines shared counters or selects nodes per device while
// DRAPartitionableDevices is off, one whose devices name compatibility
// groups while DRADeviceCompatibilityGroups (alpha, off in 1.37) is off.
func (d *draGPUs) ignoredByAllocator(slice *resourceapi.ResourceSlice) bool {
	spec := slice.Spec
	if !d.features.PartitionableDevices && (spec.PerDeviceNodeSelection != nil || len(spec.SharedCounters) > 0) {
		return true
	}
	if d.features.CompatibilityGroups {
		return false
	}
	for _, dev := range spec.Devices {
		for _, c := range dev.ConsumesCounters {
			if len(c.CompatibilityGroups) > 0 {
				return true
			}
		}
	}
	return false
}

// gpuClasses lists the GPU classes, by name, and a key that changes when
// any of them changes.
func (d *draGPUs) gpuClasses(ctx context.Context) ([]*resourceapi.DeviceClass, string) {
	classes, err := d.manager.DeviceClasses().List()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing DeviceClasses")
		return nil, ""
	}
	var gpuClasses []*resourceapi.DeviceClass
	for _, c := range classes {
		if d.isGPUClass(c) {
			gpuClasses = append(gpuClasses, c)
		}
	}
	sort.Slice(gpuClasses, func(i, j int) bool { return gpuClasses[i].Name < gpuClasses[j].Name })
	// The key is what decides which devices a class selects.
	var key strings.Builder
	for _, c := range gpuClasses {
		fmt.Fprintf(&key, "%s{", c.Name)
		for _, sel := range c.Spec.Selectors {
			if sel.CEL != nil {
				fmt.Fprintf(&key, "%q,", sel.CEL.Expression)
			}
		}
		key.WriteString("}")
	}
	return gpuClasses, key.String()
}

// attributeDomains maps each topology attribute to each node's value of
// it: that of the first device that has it among the node's own slices (by
// name, in device order), else among the devices that name the node in
// slices that select nodes per device (by name, in device order).
func (d *draGPUs) attributeDomains(byNode map[string][]*resourceapi.ResourceSlice) map[string]map[string]string {
	if len(d.attributes) == 0 {
		return nil
	}
	byName := func(slices []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
		sorted := append([]*resourceapi.ResourceSlice(nil), slices...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
		return sorted
	}
	perDevice := byName(slices.DeleteFunc(slices.Clone(byNode[""]), func(s *resourceapi.ResourceSlice) bool {
		return !ptr.Deref(s.Spec.PerDeviceNodeSelection, false)
	}))
	out := map[string]map[string]string{}
	for _, attr := range d.attributes {
		values := map[string]string{}
		for node, nodeSlices := range byNode {
			if node == "" {
				continue
			}
			for _, s := range byName(nodeSlices) {
				if v := attributeOf(s, attr); v != "" {
					values[node] = v
					break
				}
			}
		}
		for _, s := range perDevice {
			for i := range s.Spec.Devices {
				dev := &s.Spec.Devices[i]
				node := ptr.Deref(dev.NodeName, "")
				if node == "" || values[node] != "" {
					continue
				}
				if v := deviceAttribute(s.Spec.Driver, dev, attr); v != "" {
					values[node] = v
				}
			}
		}
		out[attr] = values
	}
	return out
}

// attributeOf is the value of attribute (domain/name) on the slice's first
// device that has it.
func attributeOf(s *resourceapi.ResourceSlice, attribute string) string {
	for i := range s.Spec.Devices {
		if v := deviceAttribute(s.Spec.Driver, &s.Spec.Devices[i], attribute); v != "" {
			return v
		}
	}
	return ""
}

// deviceAttribute is the value of attribute (domain/name) on dev, a device
// of driver; a device may write the name alone when the domain is its
// driver's.
func deviceAttribute(driver string, dev *resourceapi.Device, attribute string) string {
	domain, name, _ := strings.Cut(attribute, "/")
	a, ok := dev.Attributes[resourceapi.QualifiedName(attribute)]
	if !ok && domain == driver {
		a, ok = dev.Attributes[resourceapi.QualifiedName(name)]
	}
	if !ok {
		return ""
	}
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

// Domain is node's domain at a level named by a device attribute.
func (d *draGPUs) Domain(node, attribute string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.domains[attribute][node]
}

// topologyVersion is the version of the attribute levels' domains as
// the last snapshot indexed them (every plan takes a snapshot first).
func (d *draGPUs) topologyVersion() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.version
}

// slicesByNode is the slices by node as the last snapshot indexed them
// (every plan takes a snapshot before its filter check).
func (d *draGPUs) slicesByNode() map[string][]*resourceapi.ResourceSlice {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.byNode
}

func newDRAGPUs(h fwk.Handle, gpu v1.ResourceName, named []string, levels []gang.Level) *draGPUs {
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	d := &draGPUs{gpu: gpu, named: sets.New(named...), slices: map[string]*sliceGPUs{},
		features: dynamicresources.AllocatorFeatures(fts),
		cel: cel.NewCache(10, cel.Features{EnableConsumableCapacity: fts.EnableDRAConsumableCapacity,
			EnableListTypeAttributes: fts.EnableDRAListTypeAttributes})}
	if fts.EnableDynamicResourceAllocation {
		d.manager = h.SharedDRAManager()
	}
	for _, l := range levels {
		if l.Attribute != "" {
			d.attributes = append(d.attributes, l.Attribute)
		}
	}
	return d
}

// enabled reports whether the scheduler allocates DRA devices at all.
func (d *draGPUs) enabled() bool { return d != nil && d.manager != nil }

// isGPUClass reports whether devices of class count as GPUs.
func (d *draGPUs) isGPUClass(class *resourceapi.DeviceClass) bool {
	if d.named.Has(class.Name) {
		return true
	}
	return class.Spec.ExtendedResourceName != nil && v1.ResourceName(*class.Spec.ExtendedResourceName) == d.gpu
}

// gpuClass reports whether the class named name counts as GPUs; a class
// that does not exist does not.
func (d *draGPUs) gpuClass(name string) bool {
	if d.named.Has(name) {
		return true
	}
	class, err := d.manager.DeviceClasses().Get(name)
	return err == nil && d.isGPUClass(class)
}

// draState is one plan's view of the DRA GPUs.
type draState struct {
	// free is each node's free devices in GPU classes; nodes without any
	// may be absent.
	free map[string]int64
	// version changes whenever free does (a fingerprint, for reusing a
	// failed plan's answer only while nothing changed).
	version int64
}

// freeOn is node's free DRA GPUs; 0 without a view.
func (s *draState) freeOn(node string) int64 {
	if s == nil {
		return 0
	}
	return s.free[node]
}

// snapshot reads the DRA GPUs now; nil when DRA is off or no GPU class
// exists. An error means the state could not be read (the plan must not
// take it for "no GPUs").
func (d *draGPUs) snapshot(ctx context.Context) (*draState, error) {
	if !d.enabled() {
		return nil, nil
	}
	slices, err := d.manager.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	state, err := d.allocatedState(ctx)
	if err != nil {
		return nil, err
	}
	inUse := devicesInUse(state)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.index(ctx, slices) == 0 {
		return nil, nil // no GPU class
	}
	counted := d.counted
	st := &draState{free: maps.Clone(counted.perNode), version: counted.generations + counted.total}
	freeTotal := counted.total
	for id := range state.AllocatedDevices {
		if node, ok := counted.node[id]; ok {
			st.free[node]--
			st.version--
			freeTotal--
		}
	}
	for _, c := range counted.shareable {
		for _, id := range c.devices {
			if c.free(id, state) {
				st.free[c.nodeOf(id)]++
				st.version++
				freeTotal++
			}
		}
	}
	if counted.partitioned && d.features.PartitionableDevices {
		d.withinCounters(st, state, inUse)
	}
	if freeTotal == 0 && len(inUse) == 0 {
		return nil, nil
	}
	return st, nil
}

// nodeOf is the node of GPU device id of c.
func (c *sliceGPUs) nodeOf(id structured.DeviceID) string {
	if c.deviceNodes != nil {
		return c.deviceNodes[id]
	}
	return c.node
}

// nodeLocalGPUs are the GPU devices of slice, which selects nodes per
// device (DRAPartitionableDevices), that name one node, and their nodes.
func (d *draGPUs) nodeLocalGPUs(ctx context.Context, slice *resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass) ([]structured.DeviceID, map[structured.DeviceID]string) {
	nodes := map[structured.DeviceID]string{}
	for _, dev := range slice.Spec.Devices {
		if node := ptr.Deref(dev.NodeName, ""); node != "" {
			nodes[structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, dev.Name)] = node
		}
	}
	ids := slices.DeleteFunc(d.matchGPUs(ctx, slice, classes), func(id structured.DeviceID) bool { return nodes[id] == "" })
	return ids, nodes
}

// free reports whether GPU device id of c takes one more request for a
// whole GPU: it is allocated to no claim or, if it allows multiple
// allocations, one more share of it fits.
func (c *sliceGPUs) free(id structured.DeviceID, state *structured.AllocatedState) bool {
	if state.AllocatedDevices.Has(id) {
		return false
	}
	dev := c.shareable[id]
	return dev == nil || shareFits(dev, state.AggregatedCapacity[id])
}

// shareFits reports whether a request that names no capacity (a whole
// GPU, as muster counts them) fits what is left of dev, a device that
// allows multiple allocations. Such a request is charged each capacity's
// default, or all of it without a policy (CmpRequestOverCapacity in
// k8s.io/dynamic-resource-allocation/structured), so a device shared by
// others is no free GPU unless its policy's default leaves room. A policy
// without a default may refuse the whole value; such a device is not
// counted.
func shareFits(dev *resourceapi.Device, consumed structured.ConsumedCapacity) bool {
	for name, c := range dev.Capacity {
		charge := c.Value
		if p := c.RequestPolicy; p != nil {
			if p.Default == nil {
				return false
			}
			charge = *p.Default
		}
		total := charge.DeepCopy()
		if used := consumed[name]; used != nil {
			total.Add(*used)
		}
		if total.Cmp(c.Value) > 0 {
			return false
		}
	}
	return true
}

// shareableGPUs picks from the GPU devices of slice those that allow
// multiple allocations; nil while DRAConsumableCapacity is off (the
// allocator then gives each device to one claim).
func (d *draGPUs) shareableGPUs(slice *resourceapi.ResourceSlice, gpus []structured.DeviceID) map[structured.DeviceID]*resourceapi.Device {
	if !d.features.ConsumableCapacity || len(gpus) == 0 {
		return nil
	}
	var out map[structured.DeviceID]*resourceapi.Device
	for i := range slice.Spec.Devices {
		dev := &slice.Spec.Devices[i]
		if !ptr.Deref(dev.AllowMultipleAllocations, false) {
			continue
		}
		if id := structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, dev.Name); slices.Contains(gpus, id) {
			if out == nil {
				out = map[structured.DeviceID]*resourceapi.Device{}
			}
			out[id] = dev
		}
	}
	return out
}

// devicesInUse are the devices the allocator counts as drawing on their
// pool's counters (IsDeviceAllocated in k8s.io/dynamic-resource-allocation/structured):
// those allocated to a claim and those of which a share is allocated.
func devicesInUse(state *structured.AllocatedState) sets.Set[structured.DeviceID] {
	if len(state.AllocatedSharedDeviceIDs) == 0 && len(state.AggregatedCapacity) == 0 {
		return state.AllocatedDevices
	}
	inUse := state.AllocatedDevices.Clone()
	for shared := range state.AllocatedSharedDeviceIDs {
		inUse.Insert(shared.GetDeviceID())
	}
	for id := range state.AggregatedCapacity {
		inUse.Insert(id)
	}
	return inUse
}

// consumesCounters reports whether dev draws on its pool's shared counters
// (a partitionable GPU, or one of its partitions).
func consumesCounters(dev resourceapi.Device) bool { return len(dev.ConsumesCounters) > 0 }

func anyConsumesCounters(devs []resourceapi.Device) bool {
	for _, dev := range devs {
		if consumesCounters(dev) {
			return true
		}
	}
	return false
}

// poolCounters are the counters left in one pool: counter set → counter →
// value.
type poolCounters map[string]map[string]resource.Quantity

// take subtracts what consumes draws from the counters if they cover it
// all, and reports whether they did. With force it subtracts anyway (an
// allocated device's consumption, which may leave a counter below zero).
func (p poolCounters) take(consumes []resourceapi.DeviceCounterConsumption, force bool) bool {
	if !force {
		for _, c := range consumes {
			for name, want := range c.Counters {
				if left, ok := p[c.CounterSet][name]; ok && left.Cmp(want.Value) < 0 {
					return false
				}
			}
		}
	}
	for _, c := range consumes {
		for name, want := range c.Counters {
			if left, ok := p[c.CounterSet][name]; ok {
				left.Sub(want.Value)
				p[c.CounterSet][name] = left
			}
		}
	}
	return true
}

// withinCounters takes out of st the free GPU devices their pool's shared
// counters no longer cover: a GPU one of whose partitions is allocated is
// no free GPU, though no claim holds the GPU device itself. The counters
// left are what the allocator starts from (checkAvailableCounters in
// k8s.io/dynamic-resource-allocation/structured): each set's values less
// what the devices in use consume. The free GPU devices then draw on
// them in slice and device order; one they do not cover is not free (a
// shared device in use has drawn already: a further share is not charged).
// d.mu is held.
func (d *draGPUs) withinCounters(st *draState, state *structured.AllocatedState, inUse sets.Set[structured.DeviceID]) {
	pools := map[draPool]poolCounters{}
	var partitioned []*sliceGPUs
	for _, c := range d.slices {
		if !c.counters || !c.current {
			continue
		}
		partitioned = append(partitioned, c)
		id := poolOf(c.slice)
		for _, set := range c.slice.Spec.SharedCounters {
			if pools[id] == nil {
				pools[id] = poolCounters{}
			}
			counters := make(map[string]resource.Quantity, len(set.Counters))
			for name, c := range set.Counters {
				counters[name] = c.Value.DeepCopy()
			}
			pools[id][set.Name] = counters
		}
	}
	sort.Slice(partitioned, func(i, j int) bool { return partitioned[i].slice.Name < partitioned[j].slice.Name })
	for _, c := range partitioned {
		for _, dev := range c.slice.Spec.Devices {
			if consumesCounters(dev) && inUse.Has(structured.MakeDeviceID(c.slice.Spec.Driver, c.slice.Spec.Pool.Name, dev.Name)) {
				pools[poolOf(c.slice)].take(dev.ConsumesCounters, true)
			}
		}
	}
	for _, c := range partitioned {
		gpus := sets.New(c.devices...)
		for _, dev := range c.slice.Spec.Devices {
			id := structured.MakeDeviceID(c.slice.Spec.Driver, c.slice.Spec.Pool.Name, dev.Name)
			if !consumesCounters(dev) || !gpus.Has(id) || inUse.Has(id) || !c.free(id, state) {
				continue
			}
			if !pools[poolOf(c.slice)].take(dev.ConsumesCounters, false) {
				st.free[c.nodeOf(id)]--
			}
		}
	}
}

// allocatedState is what the DynamicResources plugin's PreFilter counts as
// allocated: allocated and in-flight devices (and consumed capacity when
// that feature is on). The tracker reports a concurrent modification while
// a binding writes a claim; like the plugin, ask again (briefly).
func (d *draGPUs) allocatedState(ctx context.Context) (*structured.AllocatedState, error) {
	var state *structured.AllocatedState
	err := wait.PollUntilContextTimeout(ctx, time.Microsecond, 5*time.Second, true, func(context.Context) (bool, error) {
		if d.features.ConsumableCapacity {
			s, err := d.manager.ResourceClaims().GatherAllocatedState()
			if err != nil || s == nil {
				return false, nil
			}
			state = s
			return true, nil
		}
		devices, err := d.manager.ResourceClaims().ListAllAllocatedDevices()
		if err != nil {
			return false, nil
		}
		state = &structured.AllocatedState{AllocatedDevices: devices,
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the allocated DRA devices: %w", err)
	}
	return state, nil
}

// matchGPUs lists the devices of slice that some GPU class selects, but
// for those a NoSchedule or NoExecute taint keeps from the pods that do
// not tolerate it: the allocator refuses them (as the taints of unhealthy
// GPUs are meant to), and a claim made for an extended resource tolerates
// none.
func (d *draGPUs) matchGPUs(ctx context.Context, slice *resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass) []structured.DeviceID {
	var ids []structured.DeviceID
	for i := range slice.Spec.Devices {
		dev := &slice.Spec.Devices[i]
		if d.features.DeviceTaints && tainted(dev) {
			continue
		}
		if !d.features.PartitionableDevices && consumesCounters(*dev) {
			continue // the allocator refuses it
		}
		input := cel.Device{Driver: slice.Spec.Driver, AllowMultipleAllocations: dev.AllowMultipleAllocations,
			Attributes: dev.Attributes, Capacity: dev.Capacity}
		for _, class := range classes {
			if d.selects(ctx, class, input) {
				ids = append(ids, structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, dev.Name))
				break
			}
		}
	}
	return ids
}

// tainted reports whether a taint keeps dev from pods that do not tolerate
// it (the effects the allocator heeds).
func tainted(dev *resourceapi.Device) bool {
	for _, t := range dev.Taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			return true
		}
	}
	return false
}

// selects evaluates the class's selectors on the device; a selector that
// does not compile or fails selects nothing.
func (d *draGPUs) selects(ctx context.Context, class *resourceapi.DeviceClass, dev cel.Device) bool {
	for _, sel := range class.Spec.Selectors {
		if sel.CEL == nil {
			continue
		}
		expr := d.cel.GetOrCompile(sel.CEL.Expression)
		if expr.Error != nil {
			return false
		}
		ok, _, err := expr.DeviceMatches(ctx, dev)
		if err != nil || !ok {
			return false
		}
	}
	return true
}

// nodeGPUs sets a node's free GPUs in free to what both paths offer: its
// device-plugin GPUs (allocatable minus requested) and its free DRA
// devices. On a node with no GPU allocatable, pods' GPU requests were
// served by DRA: they are among the allocated devices, not subtracted from
// allocatable again.
func nodeGPUs(free *gang.Resources, ni fwk.NodeInfo, gpu v1.ResourceName, draFree int64) {
	devicePlugin := ni.GetAllocatable().GetScalarResources()[gpu] > 0
	switch {
	case devicePlugin && draFree == 0:
	case devicePlugin:
		free.Scalars[gpu] += draFree
	case draFree > 0 || free.Scalars[gpu] != 0:
		if free.Scalars == nil {
			free.Scalars = map[v1.ResourceName]int64{}
		}
		free.Scalars[gpu] = draFree
	}
}

// podClaims are the ResourceClaims pod references, resolved as the
// DynamicResources plugin resolves them (a template's claim through the
// pod's status); a claim not created yet is left out (the plugin's
// PreEnqueue holds the pod until it exists).
func (d *draGPUs) podClaims(pod *v1.Pod) []*resourceapi.ResourceClaim {
	if !d.enabled() || len(pod.Spec.ResourceClaims) == 0 {
		return nil
	}
	var claims []*resourceapi.ResourceClaim
	for _, ref := range pod.Spec.ResourceClaims {
		name := ""
		switch {
		case ref.ResourceClaimName != nil:
			name = *ref.ResourceClaimName
		case ref.ResourceClaimTemplateName != nil:
			for _, s := range pod.Status.ResourceClaimStatuses {
				if s.Name == ref.Name && s.ResourceClaimName != nil {
					name = *s.ResourceClaimName
				}
			}
		}
		if name == "" {
			continue
		}
		claim, err := d.manager.ResourceClaims().Get(pod.Namespace, name)
		if err != nil {
			continue
		}
		claims = append(claims, claim)
	}
	return claims
}

// claimGPUs is how many devices of GPU classes claim asks for: each
// ExactCount request's count, 1 for an All request or a prioritized list
// (at least one device; the filters decide the rest).
func (d *draGPUs) claimGPUs(claim *resourceapi.ResourceClaim) int64 {
	var n int64
	for _, r := range claim.Spec.Devices.Requests {
		switch {
		case r.Exactly != nil:
			if !d.gpuClass(r.Exactly.DeviceClassName) {
				continue
			}
			if r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll {
				n++
			} else {
				n += max(r.Exactly.Count, 1)
			}
		case len(r.FirstAvailable) > 0:
			least := int64(-1)
			for _, sub := range r.FirstAvailable {
				c := int64(0)
				if d.gpuClass(sub.DeviceClassName) {
					c = max(sub.Count, 1)
				}
				if least < 0 || c < least {
					least = c
				}
			}
			n += max(least, 0)
		}
	}
	return n
}

// allocatedGPUs is how many of claim's allocated devices are in GPU
// classes. A share of a device that allows multiple allocations counts
// for none: evicting its pod frees a whole GPU only if no other share
// is left, which the dry run of the preemption asks the framework.
func (d *draGPUs) allocatedGPUs(claim *resourceapi.ResourceClaim) int64 {
	if claim.Status.Allocation == nil {
		return 0
	}
	classes := map[string]string{}
	for _, r := range claim.Spec.Devices.Requests {
		if r.Exactly != nil {
			classes[r.Name] = r.Exactly.DeviceClassName
		}
		for _, sub := range r.FirstAvailable {
			classes[r.Name+"/"+sub.Name] = sub.DeviceClassName
		}
	}
	var n int64
	for _, res := range claim.Status.Allocation.Devices.Results {
		if class, ok := classes[res.Request]; ok && res.ShareID == nil && d.gpuClass(class) {
			n++
		}
	}
	return n
}

// claimUnit is the unit a pod's claims are counted for: the pods
// placed together (one gang's pending members) or evicted together (one
// victim gang's bound members). nil is the pod alone.
type claimUnit struct {
	// counted holds the claims already counted for another pod of the
	// unit: a claim several of them share is allocated once and counts
	// once, for the first.
	counted sets.Set[types.UID]
	// has reports whether a pod is in the unit; nil for pending members
	// (a pending pod's claim counts while it is unallocated, whoever
	// else it is for).
	has func(types.UID) bool
}

// request is a pod's request as muster counts it, from req (as the
// framework counts it):
//   - the GPUs of the pod's ResourceClaims are added: those still to
//     allocate when pending, those allocated to it when bound (what its
//     eviction frees), once per unit. A bound pod's claim that is
//     reserved for a consumer outside the unit is counted for none: its
//     eviction frees nothing while that consumer runs (a PodGroup
//     reservation is dropped only when the PodGroup is gone);
//   - extended resources other than the GPU that a DeviceClass serves are
//     left out: nodes do not list them in allocatable, NodeResourcesFit
//     leaves them to DynamicResources, and the plan's filter check asks
//     that plugin node by node. (The GPU's DRA devices are counted on the
//     nodes, nodeGPUs.) Those a GPU class serves under another name (its
//     implicit deviceclass.resource.kubernetes.io/CLASS, or the own name
//     of a class in gpuDeviceClasses) are GPUs, and count as such.
func (d *draGPUs) request(req gang.Resources, pod *v1.Pod, unit *claimUnit) gang.Resources {
	d.leaveToDRA(&req)
	claims := d.podClaims(pod)
	var n int64
	for _, c := range claims {
		if unit != nil && unit.counted.Has(c.UID) {
			continue
		}
		switch {
		case pod.Spec.NodeName == "" && c.Status.Allocation == nil:
			n += d.claimGPUs(c)
		case pod.Spec.NodeName != "" && onlyFor(c, pod, unit):
			n += d.allocatedGPUs(c)
		default:
			continue
		}
		if unit != nil {
			unit.counted.Insert(c.UID)
		}
	}
	if n == 0 {
		return req
	}
	if req.Scalars == nil {
		req.Scalars = map[v1.ResourceName]int64{}
	}
	req.Scalars[d.gpu] += n
	return req
}

// leaveToDRA takes out of req the extended resources, other than the GPU,
// that a DeviceClass serves, and counts those of GPU classes as the GPU
// (request). req's Scalars are its own.
func (d *draGPUs) leaveToDRA(req *gang.Resources) {
	if !d.enabled() {
		return
	}
	var gpus int64
	for name, n := range req.Scalars {
		if name == d.gpu || !schedutil.IsDRAExtendedResourceName(name) {
			continue
		}
		if class := d.manager.DeviceClassResolver().GetDeviceClass(name); class != nil {
			delete(req.Scalars, name)
			if d.isGPUClass(class) {
				gpus += n
			}
		}
	}
	if gpus > 0 {
		req.Scalars[d.gpu] += gpus
	}
}

// onlyFor reports whether claim is reserved for no consumer but pod and
// the pods of its unit.
func onlyFor(claim *resourceapi.ResourceClaim, pod *v1.Pod, unit *claimUnit) bool {
	for _, r := range claim.Status.ReservedFor {
		if r.UID == pod.UID {
			continue
		}
		if r.APIGroup != "" || r.Resource != "pods" || unit == nil || unit.has == nil || !unit.has(r.UID) {
			return false
		}
	}
	return true
}

// extendedClaim is the claim the DynamicResources plugin makes for pod's
// extended resources on a node without them in allocatable (a DRA node),
// with the same requests: one per resource, ExactCount of the class the
// resource maps to. nil when the node serves them all by device plugin.
func (d *draGPUs) extendedClaim(pod *v1.Pod, requested map[v1.ResourceName]int64, ni fwk.NodeInfo) *resourceapi.ResourceClaim {
	var reqs []resourceapi.DeviceRequest
	names := make([]string, 0, len(requested))
	for name := range requested {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for i, name := range names {
		rn := v1.ResourceName(name)
		q := requested[rn]
		if q <= 0 || !schedutil.IsDRAExtendedResourceName(rn) || ni.GetAllocatable().GetScalarResources()[rn] > 0 {
			continue
		}
		class := d.manager.DeviceClassResolver().GetDeviceClass(rn)
		if class == nil {
			continue
		}
		reqs = append(reqs, resourceapi.DeviceRequest{Name: fmt.Sprintf("request-%d", i), Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: q}})
	}
	if len(reqs) == 0 {
		return nil
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name + "-extended-resources", UID: pod.UID + "-extended-resources"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
}
