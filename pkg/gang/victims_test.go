package gang

import (
	"fmt"
	"math/rand"
	"testing"
	"time"
)

// victimInstance is a small random cluster: 8-GPU nodes, each unit (a gang
// or a lone pod) holding GPUs on one or two nodes, and a preemptor gang.
type victimInstance struct {
	nodes   []testNode
	units   []VictimUnit
	holds   []map[int]int64 // unit → node index → GPUs
	members []Member
}

func randomVictimInstance(rng *rand.Rand) victimInstance {
	inst := victimInstance{}
	n := 3 + rng.Intn(3)
	used := make([]int64, n)
	for u := 0; u < 2+rng.Intn(6); u++ {
		hold := map[int]int64{}
		var gpus int64
		for range 1 + rng.Intn(2) {
			node := rng.Intn(n)
			g := min(int64(1+rng.Intn(8)), 8-used[node])
			if g <= 0 {
				continue
			}
			hold[node] += g
			used[node] += g
			gpus += g
		}
		if gpus == 0 {
			continue
		}
		inst.holds = append(inst.holds, hold)
		inst.units = append(inst.units, VictimUnit{Name: fmt.Sprintf("u%d", u), GPUs: gpus, Pods: len(hold),
			Started: time.Unix(int64(rng.Intn(100)), 0)})
	}
	for i := range n {
		inst.nodes = append(inst.nodes, testNode{name: fmt.Sprintf("r1-n%d", i), rack: "r1", used: used[i]})
	}
	inst.members = gangOf(1+rng.Intn(3), int64(1+rng.Intn(8)))
	return inst
}

// fits reports whether the preemptor gang is planned with the units in
// removed gone.
func (inst victimInstance) fits(removed []int) bool {
	nodes := append([]testNode(nil), inst.nodes...)
	for _, u := range removed {
		for node, g := range inst.holds[u] {
			nodes[node].used -= g
		}
	}
	_, err := Compute(request(inst.members), views(nodes...))
	return err == nil
}

// The victim search evicts exactly as few GPUs as the best choice found by
// trying every subset, on seeded random instances.
func TestChooseVictimsMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewSource(42))
	solved := 0
	for i := range 500 {
		inst := randomVictimInstance(rng)
		if inst.fits(nil) {
			continue // no preemption needed
		}
		best := int64(-1)
		for mask := 1; mask < 1<<len(inst.units); mask++ {
			var set []int
			var gpus int64
			for u := range inst.units {
				if mask&(1<<u) != 0 {
					set = append(set, u)
					gpus += inst.units[u].GPUs
				}
			}
			if (best < 0 || gpus < best) && inst.fits(set) {
				best = gpus
			}
		}
		choice := VictimSearch{Units: inst.units, MaxChecks: 1 << (len(inst.units) + 1)}.Choose(inst.fits)
		chosen, found := choice.Units, choice.Units != nil
		if found != (best >= 0) {
			t.Fatalf("instance %d: found=%v, brute force found=%v", i, found, best >= 0)
		}
		if !found {
			continue
		}
		solved++
		var gpus int64
		for _, u := range chosen {
			gpus += inst.units[u].GPUs
		}
		if gpus != best {
			t.Errorf("instance %d: evicts %d GPUs (%v), the optimum is %d", i, gpus, chosen, best)
		}
		if !inst.fits(chosen) {
			t.Errorf("instance %d: the chosen victims %v do not make room", i, chosen)
		}
	}
	if solved < 50 {
		t.Fatalf("only %d instances needed and allowed preemption; the test proves little", solved)
	}
}

func TestChooseVictimsOrder(t *testing.T) {
	always := func([]int) bool { return true }
	units := []VictimUnit{
		{Name: "big", GPUs: 16, FreedGPUs: 16},
		{Name: "pdb", GPUs: 1, FreedGPUs: 1, Budgets: map[int]int32{0: 1}},
		{Name: "old", GPUs: 8, FreedGPUs: 8, Started: time.Unix(10, 0)},
		{Name: "new", GPUs: 8, FreedGPUs: 8, Started: time.Unix(20, 0)},
		{Name: "high", GPUs: 8, FreedGPUs: 8, Priority: 5, Started: time.Unix(30, 0)},
	}
	// Any single unit makes room: no PDB violation first (budget 0 allows
	// none), then fewest GPUs, then lowest priority, then most recently
	// started.
	choice := VictimSearch{Units: units, Allowed: []int32{0}, MaxChecks: 100}.Choose(always)
	if len(choice.Units) != 1 || units[choice.Units[0]].Name != "new" || choice.Violations != 0 {
		t.Errorf("chose %+v, want [new] without violations", choice)
	}
	// Never more than MaxChecks dry runs, and only every unit together
	// makes room here.
	calls := 0
	onlyAll := func(set []int) bool { calls++; return len(set) == len(units) }
	if c := (VictimSearch{Units: units, Allowed: []int32{0}, MaxChecks: 7}).Choose(onlyAll); len(c.Units) != len(units) || calls != 7 || c.Checks != 7 {
		t.Errorf("found %v after %d checks (%d reported), want every unit after 7", c.Units, calls, c.Checks)
	}
	if c := (VictimSearch{MaxChecks: 10}).Choose(always); c.Units != nil {
		t.Error("found victims among none")
	}
}

// Among sets of as many GPUs and units, the one of fewer pods: a lone
// pod, not a 20-pod Job that started later.
func TestChooseVictimsPrefersFewerPods(t *testing.T) {
	units := []VictimUnit{
		{Name: "job", Pods: 20, Started: time.Unix(20, 0)},
		{Name: "lone", Pods: 1, Started: time.Unix(10, 0)},
	}
	choice := VictimSearch{Units: units, MaxChecks: 10}.Choose(func([]int) bool { return true })
	if len(choice.Units) != 1 || units[choice.Units[0]].Name != "lone" {
		t.Errorf("chose %v, want [lone]", choice.Units)
	}
}

// TestChooseVictimsCountsBudgetsForTheSet: two pods of one budget that
// allows one disruption are each harmless alone but two disruptions
// together; a 24-GPU gang that no budget covers is evicted instead.
func TestChooseVictimsCountsBudgetsForTheSet(t *testing.T) {
	units := []VictimUnit{
		{Name: "pdb-a", GPUs: 8, FreedGPUs: 8, Pods: 1, Budgets: map[int]int32{0: 1}},
		{Name: "pdb-b", GPUs: 8, FreedGPUs: 8, Pods: 1, Budgets: map[int]int32{0: 1}},
		{Name: "gang", GPUs: 24, FreedGPUs: 24, Pods: 3},
	}
	names := func(c VictimChoice) []string {
		var out []string
		for _, i := range c.Units {
			out = append(out, units[i].Name)
		}
		return out
	}
	needs16 := func(set []int) bool {
		var freed int64
		for _, i := range set {
			freed += units[i].FreedGPUs
		}
		return freed >= 16
	}
	c := VictimSearch{Units: units, Allowed: []int32{1}, MaxChecks: 100}.Choose(needs16)
	if got := names(c); len(got) != 1 || got[0] != "gang" || c.Violations != 0 {
		t.Errorf("chose %v (%d violations), want [gang] with none", got, c.Violations)
	}
	// When only a violating set makes room, the one with the fewest
	// violations: both budget pods (one over the allowance), not more.
	units[2].FreedGPUs, units[2].GPUs = 4, 4
	c = VictimSearch{Units: units, Allowed: []int32{1}, MaxChecks: 100}.Choose(needs16)
	if got := names(c); len(got) != 2 || c.Violations != 1 {
		t.Errorf("chose %v (%d violations), want both budget pods with 1", got, c.Violations)
	}
}

// TestChooseVictimsSkipsSetsFreeingTooFew: sets that free fewer GPUs than
// the gang lacks are never planned; when evicting everything would not make
// room either, one dry run decides; with many small units the search still
// ends with a set that frees what is needed, within its checks.
func TestChooseVictimsSkipsSetsFreeingTooFew(t *testing.T) {
	var units []VictimUnit
	for i := range 40 {
		units = append(units, VictimUnit{Name: fmt.Sprintf("small-%02d", i), GPUs: 1, FreedGPUs: 1, Pods: 1})
	}
	units = append(units, VictimUnit{Name: "gang", GPUs: 16, FreedGPUs: 16, Pods: 2})
	freed := func(set []int) int64 {
		var n int64
		for _, i := range set {
			n += units[i].FreedGPUs
		}
		return n
	}
	calls := 0
	c := VictimSearch{Units: units, MinFreedGPUs: 16, MaxChecks: 256}.Choose(func(set []int) bool {
		calls++
		return freed(set) >= 16
	})
	if freed(c.Units) != 16 {
		t.Errorf("chose %v freeing %d GPUs, want a set freeing exactly the 16 needed", c.Units, freed(c.Units))
	}
	if calls > 256 || calls != c.Checks {
		t.Errorf("%d dry runs (reported %d), want at most 256", calls, c.Checks)
	}

	calls = 0
	c = VictimSearch{Units: units, MinFreedGPUs: 16, MaxChecks: 256}.Choose(func(set []int) bool {
		calls++
		return false
	})
	if c.Units != nil || calls != 1 {
		t.Errorf("chose %v after %d dry runs; want nothing after 1 (evicting everything does not help)", c.Units, calls)
	}
	if c := (VictimSearch{Units: units, MinFreedGPUs: 100, MaxChecks: 256}).Choose(func([]int) bool { t.Fatal("checked a set"); return true }); c.Units != nil {
		t.Errorf("chose %v, but all units together free less than needed", c.Units)
	}
}

// Among many small units, of which only those on one node together make
// room (a pod alone preempting on nodes full of priority-0 CPU pods), the
// search looks beside the plan it found with everything gone: 3 of the 4
// units on one node, not every unit it had no checks left to reprieve.
func TestChooseVictimsReprievesBesideThePlan(t *testing.T) {
	const nodes, perNode, needed = 1000, 4, 3
	var units []VictimUnit
	for i := range nodes * perNode {
		units = append(units, VictimUnit{Name: fmt.Sprintf("pod-%04d", i), Pods: 1, Started: time.Unix(int64(i), 0)})
	}
	planned, local := nodePlans(nodes, perNode, needed)
	search := VictimSearch{Units: units, MaxChecks: 256, Near: local}
	c := search.Choose(func(set []int) bool { return planned(set) >= 0 })
	// One check with everything gone, then at most every subset of the 4
	// units beside its plan.
	if len(c.Units) != needed || planned(c.Units) < 0 || c.Checks > 1+16 {
		t.Errorf("chose %d units after %d checks; want the %d of one node after at most 17", len(c.Units), c.Checks, needed)
	}

	// Without Local the reprieve starts from every unit and runs out of checks.
	search.Near = nil
	if c := search.Choose(func(set []int) bool { return planned(set) >= 0 }); len(c.Units) < nodes {
		t.Errorf("without Near chose %d units; the test no longer shows what Near is for", len(c.Units))
	}
}

// Beside the plan, the search does not settle for breaking a budget where
// another place breaks none: the pods of the first 20 nodes (where a plan
// with everything gone goes) are covered by a budget that allows nothing.
func TestChooseVictimsBesideAPlanThatKeepsBudgets(t *testing.T) {
	const nodes, perNode, needed = 200, 4, 3
	var units []VictimUnit
	for i := range nodes * perNode {
		u := VictimUnit{Name: fmt.Sprintf("pod-%04d", i), Pods: 1}
		if i/perNode < 20 {
			u.Budgets = map[int]int32{0: 1}
		}
		units = append(units, u)
	}
	planned, near := nodePlans(nodes, perNode, needed)
	c := VictimSearch{Units: units, Allowed: []int32{0}, MaxChecks: 256, Near: near}.Choose(func(set []int) bool { return planned(set) >= 0 })
	if len(c.Units) != needed || c.Violations != 0 || planned(c.Units) < 20 {
		t.Errorf("chose %d units breaking budgets %d times; want %d of one node no budget covers", len(c.Units), c.Violations, needed)
	}
}

// nodePlans models a plan over nodes of perNode units each (unit u on node
// u/perNode) that needs needed units of one node gone: planned is the node
// a plan with the units of set gone takes, the first with enough of its
// units gone (-1: none); near keeps the units of set on that node.
func nodePlans(nodes, perNode, needed int) (planned func(set []int) int, near func(set []int) []int) {
	nodeOf := func(u int) int { return u / perNode }
	planned = func(set []int) int {
		gone := map[int]int{}
		for _, u := range set {
			gone[nodeOf(u)]++
		}
		for n := range nodes {
			if gone[n] >= needed {
				return n
			}
		}
		return -1
	}
	near = func(set []int) []int {
		var out []int
		for _, u := range set {
			if nodeOf(u) == planned(set) {
				out = append(out, u)
			}
		}
		return out
	}
	return planned, near
}
