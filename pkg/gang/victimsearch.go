package gang

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// A preemption search: which lower-priority units to evict so that a gang
// fits. FindVictims keeps the order of the steps; what only the scheduler
// knows (the snapshot's pods, PodDisruptionBudgets, the framework's
// filters) it asks of a VictimFinder.

// Candidate is a unit a preemption may evict, as the scheduler found it
// on its snapshot.
type Candidate struct {
	VictimUnit
	// Key is the victim gang's, or the lone pod's LoneKey; Victims are its
	// pods.
	Key     Key
	Victims []*v1.Pod
	// Requests[i] is what Victims[i] frees (its requests, its claims'
	// GPUs); Nodes[i] is the position of its node in the search's views.
	Requests []Resources
	Nodes    []int
}

// VictimFinder is the scheduler's side of a preemption search.
type VictimFinder interface {
	// Candidates are the units below the gang's priority with a pod on a
	// node its policy may use; loneOn says on which nodes lone pods that
	// ask for no GPU are units too (elsewhere a GPU gang never needs them).
	// Every call after the first may return new Candidates.
	Candidates(loneOn func(node int) bool) []*Candidate
	// Budgets counts the candidates' pods per PodDisruptionBudget into
	// units[i].Budgets and returns each budget's disruptionsAllowed.
	Budgets(candidates []*Candidate, units []VictimUnit) []int32
	// TryWithout plans the gang with the pods of candidates gone, each
	// choice confirmed by the framework's filters: the plan (nil when
	// none) and the nodes where a filter refused a member (read only).
	TryWithout(candidates []*Candidate) (*Plan, map[string]bool)
}

// VictimsFound is what FindVictims found.
type VictimsFound struct {
	// Plan is the gang's plan with the chosen units gone, Pods their pods.
	Plan *Plan
	Pods []*v1.Pod
	// Candidates were searched; Choice.Units index into them (nil: no set
	// makes room).
	Candidates []*Candidate
	Choice     VictimChoice
	// Checks counts the plans tried; LowerPriority every unit below the
	// gang's priority, candidate or not.
	Checks        int
	LowerPriority int
}

// VictimSearchInput is what FindVictims searches for: the gang's request
// on views (views[i] for the i-th node of the scheduler's snapshot), its
// policy, the GPU resource, the GPUs it lacks beyond what is free, and the
// bound on plans tried per search.
type VictimSearchInput struct {
	Views     []NodeView
	Request   Request
	Policy    Policy
	GPU       v1.ResourceName
	LackGPUs  int64
	MaxChecks int
}

// FindVictims finds what to evict for the gang, changing nothing: whole
// lower-priority gangs or lone pods, the set with the fewest
// PodDisruptionBudget violations (counted for the set), then the fewest
// GPUs, then the fewest units, then the fewest pods, then the lowest
// priority, then the most recently started (VictimSearch), and only if
// the gang's plan passes the framework's filters with them gone. Only
// units that free what the gang lacks are candidates: GPUs on nodes it may
// use, so the CPU pods every real cluster runs at priority 0 cost the
// search nothing; units on nodes where the GPUs fit but something else
// does not (CPU, memory, a port, an anti-affinity, as the planner's
// screening or the framework's filters said) only when that search finds
// nothing.
func FindVictims(f VictimFinder, in VictimSearchInput) VictimsFound {
	needGPUs := NeededGPUs(in.Request)
	var found VictimsFound
	refused := map[string]bool{} // nodes the framework's filters refused a member
	search := func(units []*Candidate, minFreed int64) VictimChoice {
		candidates := make([]VictimUnit, len(units))
		for i, u := range units {
			candidates[i] = u.VictimUnit
		}
		s := VictimSearch{Units: candidates, MinFreedGPUs: minFreed, MaxChecks: in.MaxChecks}
		s.Allowed = f.Budgets(units, candidates)
		s.Near = func(feasible []int) []int { return onPlannedNodes(found.Plan, in.Views, units, feasible) }
		return s.Choose(func(indexes []int) bool {
			chosen := make([]*Candidate, len(indexes))
			for k, i := range indexes {
				chosen[k] = units[i]
			}
			plan, refusedNodes := f.TryWithout(chosen)
			maps.Copy(refused, refusedNodes)
			if plan == nil {
				return false
			}
			found.Plan, found.Pods = plan, nil
			for _, u := range chosen {
				found.Pods = append(found.Pods, u.Victims...)
			}
			return true
		})
	}
	// First the units that free GPUs, when the gang needs any.
	all := f.Candidates(func(int) bool { return needGPUs == 0 })
	var units []*Candidate
	for _, u := range all {
		if needGPUs == 0 || u.FreedGPUs > 0 {
			units = append(units, u)
		}
	}
	choice := search(units, max(in.LackGPUs, min(needGPUs, 1)))
	checks := choice.Checks
	if choice.Units == nil && needGPUs > 0 {
		// Something other than GPUs blocks: the units on the nodes where
		// the GPUs would fit but the planner's screening or the filters
		// refused a member.
		if len(units) == 0 {
			// No dry run asked the filters yet: ask once, without victims.
			_, refusedNodes := f.TryWithout(nil)
			maps.Copy(refused, refusedNodes)
		}
		// With no node blocked the candidates would be the same as above:
		// the same search, the same answer.
		if blocked := blockedNodes(in, units, refused); len(blocked) > 0 {
			units = nil
			all = f.Candidates(func(i int) bool { return blocked[i] })
			for _, u := range all {
				if u.FreedGPUs > 0 || slices.ContainsFunc(u.Nodes, func(n int) bool { return blocked[n] }) {
					units = append(units, u)
				}
			}
			if len(units) > 0 {
				// Still as many GPUs as lacked: sets that free fewer cannot
				// be enough, and would spend the exact checks first.
				choice = search(units, max(in.LackGPUs, 0))
				checks += choice.Checks
			}
		}
	}
	found.Candidates, found.Choice, found.Checks, found.LowerPriority = units, choice, checks, len(all)
	return found
}

// onPlannedNodes are the units among feasible (indexes into units) with a
// pod on a node of plan.
func onPlannedNodes(plan *Plan, views []NodeView, units []*Candidate, feasible []int) []int {
	planned := make(map[string]bool, len(plan.Slots))
	for _, node := range plan.Slots {
		planned[node] = true
	}
	var out []int
	for _, i := range feasible {
		for _, n := range units[i].Nodes {
			if planned[views[n].Node.Name] {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// blockedNodes are the positions of nodes the gang may use where a GPU
// member's GPUs fit, or a member without GPUs may go by its node
// constraints, once the units that free GPUs (gpuUnits) are gone, but it
// was still refused: by the planner's screening (CPU, memory, pods) or by
// the framework's filters (refused).
func blockedNodes(in VictimSearchInput, gpuUnits []*Candidate, refused map[string]bool) map[int]bool {
	freed := map[int]Resources{} // by node: what every GPU unit's pods there free
	for _, u := range gpuUnits {
		for k, n := range u.Nodes {
			r := freed[n]
			r.Add(u.Requests[k])
			freed[n] = r
		}
	}
	blocked := map[int]bool{}
	for i := range in.Views {
		v := &in.Views[i]
		if !v.Eligible(in.Policy) { // a node not in the snapshot has a reclaiming view
			continue
		}
		if refused[v.Node.Name] {
			blocked[i] = true
			continue
		}
		free := v.Free.Clone()
		free.Add(freed[i])
		for _, m := range in.Request.Members {
			g := m.Request.Scalars[in.GPU]
			if g > 0 && free.Scalars[in.GPU] >= g && !free.Fits(m.Request) {
				blocked[i] = true
				break
			}
			// A member without GPUs (a TFJob's Chief or PS) may be
			// kept off the GPU nodes and find its CPU pool full.
			if g == 0 && m.Constraints.Match(v.Node) && !free.Fits(m.Request) {
				blocked[i] = true
				break
			}
		}
	}
	return blocked
}
