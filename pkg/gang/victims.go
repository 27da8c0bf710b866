package gang

import (
	"container/heap"
	"sort"
	"strconv"
	"strings"
	"time"
)

// VictimUnit is what preemption evicts at once: a whole gang (every bound
// member, wherever it runs) or a lone pod. A gang is never evicted in part.
type VictimUnit struct {
	Name string
	// GPUs the unit evicts; FreedGPUs those of them on nodes the preemptor
	// may use; Pods how many pods it evicts.
	GPUs, FreedGPUs int64
	Pods            int
	// Priority is the highest priority among its pods; Started the latest
	// start among them.
	Priority int32
	Started  time.Time
	// Budgets counts, per PodDisruptionBudget (an index into
	// VictimSearch.Allowed), the unit's pods that budget covers.
	Budgets map[int]int32
}

// VictimSearch finds which units to evict so that a gang fits.
type VictimSearch struct {
	Units []VictimUnit
	// Allowed is each PodDisruptionBudget's status.disruptionsAllowed.
	Allowed []int32
	// MinFreedGPUs: a set that frees fewer GPUs (FreedGPUs) than this cannot
	// make room, and is not checked.
	MinFreedGPUs int64
	// MaxChecks bounds the calls to feasible (each one plans the gang).
	MaxChecks int
	// Near, when set, narrows a set feasible just said yes to (indexes into
	// Units) to the units the plan it made needs gone: those with a pod
	// where it places members.
	Near func(units []int) []int
}

// VictimChoice is the outcome of a search.
type VictimChoice struct {
	// Units are indexes into VictimSearch.Units, ascending; nil when no set
	// was found.
	Units []int
	// Violations is how many of the chosen pods exceed their budget.
	Violations int
	// Checks is how many sets feasible was asked about.
	Checks int
}

// victimSet is a candidate choice: positions into the ordered units,
// ascending.
type victimSet struct {
	units      []int
	violations int
	gpus       int64
	freed      int64
	count      int
	pods       int
	priority   int32 // highest priority evicted
	started    time.Time
}

// less orders candidate choices with as many budget violations: fewest
// GPUs, then fewest units, then fewest pods (as DefaultPreemption prefers
// the fewest victims: a 20-pod Job is one unit, as one lone pod is), then
// lowest priority, then the most recently started. Adding a unit, or
// replacing the last one by the next in the units' order, never makes a
// set less.
func (a *victimSet) less(b *victimSet) bool {
	if a.gpus != b.gpus {
		return a.gpus < b.gpus
	}
	if a.count != b.count {
		return a.count < b.count
	}
	if a.pods != b.pods {
		return a.pods < b.pods
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

// Choose finds the set of units for which feasible says the gang fits once
// they are gone: the fewest PodDisruptionBudget violations, counted for the
// whole set against each budget's allowance (as DefaultPreemption counts
// them), then the fewest GPUs, units, pods, lowest priority, latest start.
//
// It first asks whether evicting every unit would do: if not, nothing will,
// and the search ends after one check. Then it searches exactly, by
// violations allowed, 0 first: each pass enumerates the sets with at most
// that many violations in victimSet.less order (the classic enumeration of
// subsets in increasing sum: units sorted by cost, each set spawns "add the
// next unit" and "replace its last unit by the next one"), so the first
// feasible set of the first pass that finds one is the best. A set over the
// pass's violations is not checked and its supersets are not generated; a
// set freeing fewer than MinFreedGPUs is generated but not checked. When
// the exact search runs out of its half of the checks (many small units
// below MinFreedGPUs), it falls back to reprieving: from every unit, keep
// each one running (violating ones first, then the costliest) whose
// eviction the gang does not need. A set is checked at most once, and at
// most MaxChecks sets are.
//
// With more units than the exact search has checks, it could not even try
// each unit alone, and among many small units (priority-0 CPU pods on every
// node) its reprieve would run out of checks with nearly all of them
// chosen. Then, when Near is set, the search runs first over the units
// Near says the plan with everything gone needs (everything no budget
// covers, when that is enough): the best set beside that plan, as
// DefaultPreemption looks beside one node.
func (s VictimSearch) Choose(feasible func(units []int) bool) VictimChoice {
	var out VictimChoice
	if len(s.Units) == 0 || s.MaxChecks < 1 {
		return out
	}
	order := make([]int, len(s.Units))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		return s.newSet(order, []int{a}).less(s.newSet(order, []int{b}))
	})
	all := make([]int, len(order))
	for i := range all {
		all[i] = i
	}
	checked := map[string]bool{}
	// lastFeasible is the set feasible last said yes to: the caller keeps
	// the plan of that answer, so it is what Choose returns.
	var lastFeasible []int
	lastViolations := 0
	check := func(set *victimSet) bool {
		key := setKey(set.units)
		if checked[key] {
			return false
		}
		checked[key] = true
		out.Checks++
		chosen := make([]int, len(set.units))
		for i, pos := range set.units {
			chosen[i] = order[pos]
		}
		if !feasible(chosen) {
			return false
		}
		sort.Ints(chosen)
		lastFeasible, lastViolations = chosen, set.violations
		return true
	}
	done := func() VictimChoice {
		out.Units, out.Violations = lastFeasible, lastViolations
		return out
	}
	everything := s.newSet(order, all)
	if everything.freed < s.MinFreedGPUs || !check(everything) {
		return out
	}
	exactChecks := max(s.MaxChecks/2, 1)
	if s.Near != nil && len(s.Units) > exactChecks {
		// The plan to look beside is the one with every unit gone that no
		// budget covers, when that plan exists: one with every unit gone
		// may sit where each set breaks a budget.
		if everything.violations > 0 {
			var unbudgeted []int
			for pos, u := range order {
				if len(s.Units[u].Budgets) == 0 {
					unbudgeted = append(unbudgeted, pos)
				}
			}
			if set := s.newSet(order, unbudgeted); len(unbudgeted) > 0 && set.freed >= s.MinFreedGPUs {
				check(set)
			}
		}
		if near := s.Near(lastFeasible); len(near) < len(s.Units) {
			c := s.beside(near, s.MaxChecks-out.Checks, feasible)
			out.Checks += c.Checks
			if c.Units != nil {
				out.Units, out.Violations = c.Units, c.Violations
				return out
			}
		}
	}
	// Generated sets are bounded too: passes over sets that are never
	// checked (too few GPUs, too many violations) must end.
	visits, maxVisits := 0, 64*s.MaxChecks
	for allowed := 0; allowed <= everything.violations; allowed++ {
		h := &victimHeap{s.newSet(order, []int{0})}
		for h.Len() > 0 && out.Checks < exactChecks && visits < maxVisits {
			set := heap.Pop(h).(*victimSet)
			visits++
			lastPos := set.units[len(set.units)-1]
			next := lastPos+1 < len(order)
			if set.violations > allowed {
				// Every superset violates as much: only the sibling may not.
				if next {
					heap.Push(h, s.newSet(order, replaced(set.units, lastPos+1)))
				}
				continue
			}
			if set.freed >= s.MinFreedGPUs && check(set) {
				return done()
			}
			if next {
				heap.Push(h, s.newSet(order, append(append([]int(nil), set.units...), lastPos+1)))
				heap.Push(h, s.newSet(order, replaced(set.units, lastPos+1)))
			}
		}
	}
	// Reprieve from everything: units a budget covers first, then the
	// costliest.
	current := all
	reprieve := append([]int(nil), all...)
	sort.SliceStable(reprieve, func(a, b int) bool {
		va, vb := len(s.Units[order[reprieve[a]]].Budgets) > 0, len(s.Units[order[reprieve[b]]].Budgets) > 0
		if va != vb {
			return va
		}
		return reprieve[a] > reprieve[b]
	})
	for _, pos := range reprieve {
		if out.Checks >= s.MaxChecks || len(current) == 1 {
			break
		}
		without := make([]int, 0, len(current)-1)
		for _, q := range current {
			if q != pos {
				without = append(without, q)
			}
		}
		if set := s.newSet(order, without); set.freed >= s.MinFreedGPUs && check(set) {
			current = without
		}
	}
	return done()
}

// beside searches among the units at indexes only, with at most maxChecks
// checks; the choice's units are indexes into s.Units.
func (s VictimSearch) beside(indexes []int, maxChecks int, feasible func(units []int) bool) VictimChoice {
	sub := VictimSearch{Allowed: s.Allowed, MinFreedGPUs: s.MinFreedGPUs, MaxChecks: maxChecks}
	for _, i := range indexes {
		sub.Units = append(sub.Units, s.Units[i])
	}
	toUnits := func(subIndexes []int) []int {
		out := make([]int, len(subIndexes))
		for j, i := range subIndexes {
			out[j] = indexes[i]
		}
		sort.Ints(out)
		return out
	}
	c := sub.Choose(func(set []int) bool { return feasible(toUnits(set)) })
	if c.Units != nil {
		c.Units = toUnits(c.Units)
	}
	return c
}

func replaced(positions []int, last int) []int {
	out := append([]int(nil), positions...)
	out[len(out)-1] = last
	return out
}

func setKey(positions []int) string {
	var b strings.Builder
	for _, p := range positions {
		b.WriteString(strconv.Itoa(p))
		b.WriteByte(',')
	}
	return b.String()
}

// newSet is the set of the units at positions of order.
func (s VictimSearch) newSet(order []int, positions []int) *victimSet {
	set := &victimSet{units: positions, count: len(positions)}
	var evicted map[int]int32
	for _, pos := range positions {
		u := s.Units[order[pos]]
		set.gpus += u.GPUs
		set.freed += u.FreedGPUs
		set.pods += u.Pods
		set.priority = max(set.priority, u.Priority)
		if u.Started.After(set.started) {
			set.started = u.Started
		}
		for b, n := range u.Budgets {
			if evicted == nil {
				evicted = map[int]int32{}
			}
			evicted[b] += n
		}
	}
	for b, n := range evicted {
		allowed := int32(0)
		if b >= 0 && b < len(s.Allowed) {
			allowed = max(s.Allowed[b], 0)
		}
		set.violations += int(max(n-allowed, 0))
	}
	return set
}
