package gang

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeFinder is the scheduler's side of a search: every candidate it
// knows, lone pods without GPUs offered only where loneOn says, and a
// plan only when fits says the chosen units make room.
type fakeFinder struct {
	units []*Candidate
	fits  func(chosen []*Candidate) bool
	tried [][]string
}

func (f *fakeFinder) Candidates(loneOn func(node int) bool) []*Candidate {
	var out []*Candidate
	for _, u := range f.units {
		if u.Key.Kind != KindPod || u.GPUs > 0 || loneOn(u.Nodes[0]) {
			out = append(out, u)
		}
	}
	return out
}

func (f *fakeFinder) Budgets([]*Candidate, []VictimUnit) []int32 { return nil }

func (f *fakeFinder) TryWithout(chosen []*Candidate) (*Plan, map[string]bool) {
	var names []string
	for _, u := range chosen {
		names = append(names, u.Name)
	}
	f.tried = append(f.tried, names)
	if !f.fits(chosen) {
		return nil, nil
	}
	return &Plan{Slots: map[types.UID]string{"m0": "a"}, Nodes: 1}, nil
}

// oneMemberOf8GPUs is a gang of one member asking for 8 GPUs and a CPU.
func oneMemberOf8GPUs(gpu v1.ResourceName) Request {
	return Request{Gang: "ns/high", GPU: gpu, Needed: 1, Members: []Member{{UID: "m0", Name: "m0",
		Request: Resources{MilliCPU: 1000, Pods: 1, Scalars: map[v1.ResourceName]int64{gpu: 8}}}}}
}

// lowGangOn is a lower-priority gang of one pod with gpus GPUs on node
// position node.
func lowGangOn(gpu v1.ResourceName, gpus int64, node int) *Candidate {
	return &Candidate{Key: Key{Kind: KindJob, Namespace: "ns", Name: "low"},
		VictimUnit: VictimUnit{Name: "gang ns/low", GPUs: gpus, FreedGPUs: gpus, Pods: 1},
		Victims:    []*v1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "low-0"}}},
		Requests:   []Resources{{Scalars: map[v1.ResourceName]int64{gpu: gpus}}}, Nodes: []int{node}}
}

// A gang whose GPUs are free on node a but whose CPU is taken there by a
// lone CPU pod: the units that free GPUs are searched first (a lower gang
// on node b, where the CPU is short too), and only when no set of them
// makes room, the units on the nodes where the GPUs fit but something else
// refused the member: the CPU pod, which is chosen.
func TestFindVictimsSearchesGPUUnitsFirstThenTheBlockedNodes(t *testing.T) {
	const gpu = v1.ResourceName("nvidia.com/gpu")
	node := func(name string) *v1.Node { return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	free := func(gpus int64) Resources {
		return Resources{MilliCPU: 0, Memory: 1 << 40, Pods: 110, Scalars: map[v1.ResourceName]int64{gpu: gpus}}
	}
	views := []NodeView{NewNodeView(node("a"), free(8), gpu, false, false), NewNodeView(node("b"), free(0), gpu, false, false)}
	request := oneMemberOf8GPUs(gpu)
	lowGang := lowGangOn(gpu, 8, 1)
	hog := &Candidate{Key: Key{Kind: KindPod, Namespace: "ns", Name: "hog"},
		VictimUnit: VictimUnit{Name: "pod ns/hog", Pods: 1},
		Victims:    []*v1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "hog"}}},
		Requests:   []Resources{{MilliCPU: 4000}}, Nodes: []int{0}}
	f := &fakeFinder{units: []*Candidate{lowGang, hog}, fits: func(chosen []*Candidate) bool {
		for _, u := range chosen {
			if u == hog {
				return true
			}
		}
		return false
	}}

	found := FindVictims(f, VictimSearchInput{Views: views, Request: request, Policy: PolicyAvoid, GPU: gpu, LackGPUs: 0, MaxChecks: 16})
	t.Logf("sets tried: %v", f.tried)

	require.NotNil(t, found.Plan, "the CPU pod's eviction makes room")
	require.Len(t, found.Choice.Units, 1)
	assert.Same(t, hog, found.Candidates[found.Choice.Units[0]], "the unit on the blocked node, not the GPU gang")
	assert.Equal(t, []*v1.Pod{hog.Victims[0]}, found.Pods)
	assert.Equal(t, []string{"gang ns/low"}, f.tried[0], "the units that free GPUs are tried first, alone")
	assert.Contains(t, f.tried[1], "pod ns/hog", "then the units on the blocked nodes")
	assert.Equal(t, 2, found.LowerPriority)
	assert.Equal(t, len(f.tried), found.Checks)
}

// A gang that lacks nothing but CPU on every node (no blocked node) and
// whose GPU units cannot make room finds no victims, after trying only
// the GPU units.
func TestFindVictimsFindsNothingWhenNoSetMakesRoom(t *testing.T) {
	const gpu = v1.ResourceName("nvidia.com/gpu")
	views := []NodeView{NewNodeView(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}},
		Resources{MilliCPU: 64000, Memory: 1 << 40, Pods: 110, Scalars: map[v1.ResourceName]int64{gpu: 0}}, gpu, false, false)}
	request := oneMemberOf8GPUs(gpu)
	low := lowGangOn(gpu, 4, 0)
	f := &fakeFinder{units: []*Candidate{low}, fits: func([]*Candidate) bool { return false }}

	found := FindVictims(f, VictimSearchInput{Views: views, Request: request, Policy: PolicyAvoid, GPU: gpu, LackGPUs: 4, MaxChecks: 16})

	assert.Nil(t, found.Plan)
	assert.Nil(t, found.Choice.Units)
	assert.Equal(t, [][]string{{"gang ns/low"}}, f.tried, "the GPU unit, once; node a is no blocked node (its GPUs do not fit)")
}
