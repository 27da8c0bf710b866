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
		chosen, found := ChooseVictims(inst.units, inst.fits, 1<<len(inst.units)+1)
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
		{Name: "big", GPUs: 16},
		{Name: "pdb", GPUs: 1, ViolatesPDB: true},
		{Name: "old", GPUs: 8, Started: time.Unix(10, 0)},
		{Name: "new", GPUs: 8, Started: time.Unix(20, 0)},
		{Name: "high", GPUs: 8, Priority: 5, Started: time.Unix(30, 0)},
	}
	// Any single unit makes room: no PDB violation first, then fewest GPUs,
	// then lowest priority, then most recently started.
	chosen, ok := ChooseVictims(units, always, 100)
	if !ok || len(chosen) != 1 || units[chosen[0]].Name != "new" {
		t.Errorf("chose %v, want [new]", chosen)
	}
	// Never more than maxChecks dry runs.
	calls := 0
	if _, ok := ChooseVictims(units, func([]int) bool { calls++; return false }, 7); ok || calls != 7 {
		t.Errorf("found=%v after %d checks, want none after 7", ok, calls)
	}
	if _, ok := ChooseVictims(nil, always, 10); ok {
		t.Error("found victims among none")
	}
}
