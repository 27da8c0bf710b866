package gang

import (
	"container/heap"
	"sort"
	"time"
)

// VictimUnit is what preemption evicts at once: a whole gang (every bound
// member, wherever it runs) or a lone pod. A gang is never evicted in part.
type VictimUnit struct {
	Name string
	// GPUs the unit frees; Pods how many pods it evicts.
	GPUs int64
	Pods int
	// Priority is the highest priority among its pods; Started the latest
	// start among them.
	Priority int32
	Started  time.Time
	// ViolatesPDB: evicting it would exceed a PodDisruptionBudget.
	ViolatesPDB bool
}

// victimSet is a candidate choice: indexes into the sorted units, ascending.
type victimSet struct {
	units      []int
	violations int
	gpus       int64
	count      int
	priority   int32 // highest priority evicted
	started    time.Time
}

// less orders candidate choices: fewest PodDisruptionBudget violations (as
// DefaultPreemption), then fewest GPUs, then fewest units, then lowest
// priority, then the most recently started.
func (a *victimSet) less(b *victimSet) bool {
	if a.violations != b.violations {
		return a.violations < b.violations
	}
	if a.gpus != b.gpus {
		return a.gpus < b.gpus
	}
	if a.count != b.count {
		return a.count < b.count
	}
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.started.After(b.started)
}

type victimHeap []*victimSet

func (h victimHeap) Len() int            { return len(h) }
func (h victimHeap) Less(i, j int) bool  { return h[i].less(h[j]) }
func (h victimHeap) Swap(i, j int)       { h[i], h[j] = h[j], h[i] }
func (h *victimHeap) Push(x interface{}) { *h = append(*h, x.(*victimSet)) }
func (h *victimHeap) Pop() interface{} {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// ChooseVictims finds the best set of units (by victimSet.less) for which
// feasible says the preemptor fits once they are gone. It enumerates sets
// in that order, cheapest first, so the first feasible set has the fewest
// GPUs any feasible set has (among sets with as few PDB violations); it
// gives up after maxChecks calls to feasible. It returns indexes into units.
//
// The enumeration is the classic one for subsets in increasing sum: units
// sorted by cost, each set spawns "add the next unit" and "replace its last
// unit by the next one", both never cheaper than the set itself.
func ChooseVictims(units []VictimUnit, feasible func(indexes []int) bool, maxChecks int) ([]int, bool) {
	if len(units) == 0 {
		return nil, false
	}
	order := make([]int, len(units))
	for i := range order {
		order[i] = i
	}
	single := func(i int) *victimSet { return newVictimSet(units, order, []int{i}) }
	sort.SliceStable(order, func(a, b int) bool {
		return newVictimSet(units, []int{order[a]}, []int{0}).less(newVictimSet(units, []int{order[b]}, []int{0}))
	})
	h := &victimHeap{single(0)}
	checks := 0
	for h.Len() > 0 && checks < maxChecks {
		set := heap.Pop(h).(*victimSet)
		checks++
		chosen := make([]int, len(set.units))
		for i, pos := range set.units {
			chosen[i] = order[pos]
		}
		if feasible(chosen) {
			sort.Ints(chosen)
			return chosen, true
		}
		last := set.units[len(set.units)-1]
		if last+1 < len(units) {
			heap.Push(h, newVictimSet(units, order, append(append([]int(nil), set.units...), last+1)))
			replaced := append([]int(nil), set.units...)
			replaced[len(replaced)-1] = last + 1
			heap.Push(h, newVictimSet(units, order, replaced))
		}
	}
	return nil, false
}

func newVictimSet(units []VictimUnit, order []int, positions []int) *victimSet {
	s := &victimSet{units: positions, count: len(positions)}
	for _, pos := range positions {
		u := units[order[pos]]
		s.gpus += u.GPUs
		if u.ViolatesPDB {
			s.violations++
		}
		s.priority = max(s.priority, u.Priority)
		if u.Started.After(s.started) {
			s.started = u.Started
		}
	}
	return s
}
