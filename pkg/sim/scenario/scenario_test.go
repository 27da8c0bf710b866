package scenario

import (
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

const tiny = `
name: tiny
tick: 10s
cluster: {nodes: 10, gpusPerNode: 8, nodesPerRack: 4, zones: 2, spotFraction: 0.3}
workload:
  waves:
  - {at: 5s, duration: 1m, gangs: ["2*4x8", "3x2"]}
  poisson:
    jobs: 20
    meanInterarrival: 30s
    workers: {2: 1, 4: 1}
    gpusPerWorker: {1: 1, 8: 1}
    duration: {median: 5m, sigma: 0.5, min: 1m, max: 10m}
    policies: {avoid: 1, forbid: 1}
churn: {end: 1h, meanInterval: 5m, notice: 30s, replaceAfter: 2m, nodesPerEvent: 2}
`

func mustParse(t *testing.T, text string) *Scenario {
	t.Helper()
	s, err := Parse([]byte(text))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

func TestParseRejects(t *testing.T) {
	for name, text := range map[string]string{
		"unknown field":      "name: x\ncluster: {nodes: 1, gpusPerNode: 8, nodesPerRack: 1}\nworkload: {waves: [{duration: 1s, gangs: [1x1]}]}\ntypo: 1\n",
		"no workload":        "name: x\ncluster: {nodes: 1, gpusPerNode: 8, nodesPerRack: 1}\n",
		"bad shape":          "name: x\ncluster: {nodes: 1, gpusPerNode: 8, nodesPerRack: 1}\nworkload: {waves: [{duration: 1s, gangs: [4by8]}]}\n",
		"worker too big":     "name: x\ncluster: {nodes: 1, gpusPerNode: 8, nodesPerRack: 1}\nworkload: {waves: [{duration: 1s, gangs: [1x16]}]}\n",
		"bad policy":         "name: x\ncluster: {nodes: 1, gpusPerNode: 8, nodesPerRack: 1}\nworkload: {waves: [{duration: 1s, gangs: [1x1], policy: sometimes}]}\n",
		"churn without spot": "name: x\ncluster: {nodes: 1, gpusPerNode: 8, nodesPerRack: 1}\nworkload: {waves: [{duration: 1s, gangs: [1x1]}]}\nchurn: {end: 1h, meanInterval: 1m, notice: 1s}\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(text)); err == nil {
				t.Errorf("Parse accepted a scenario with %s", name)
			}
		})
	}
}

func TestParseShape(t *testing.T) {
	for in, want := range map[string]Shape{
		"4x8":    {Count: 1, Workers: 4, GPUs: 8},
		"3*10x8": {Count: 3, Workers: 10, GPUs: 8},
		" 16x1 ": {Count: 1, Workers: 16, GPUs: 1},
	} {
		got, err := ParseShape(in)
		if err != nil || got != want {
			t.Errorf("ParseShape(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x8", "4x", "0x8", "2*0x1", "4x8x2"} {
		if _, err := ParseShape(in); err == nil {
			t.Errorf("ParseShape(%q) accepted", in)
		}
	}
}

func TestExpandIsDeterministic(t *testing.T) {
	s := mustParse(t, tiny)
	a, err := s.Expand(7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Expand(7)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two expansions with seed 7 differ")
	}
	c, _ := s.Expand(8)
	if reflect.DeepEqual(a.Jobs, c.Jobs) {
		t.Error("seeds 7 and 8 gave the same jobs")
	}
}

func TestExpandCluster(t *testing.T) {
	p, err := mustParse(t, tiny).Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Nodes) != 10 || p.TotalGPUs() != 80 {
		t.Fatalf("got %d nodes, %d GPUs; want 10 nodes, 80 GPUs", len(p.Nodes), p.TotalGPUs())
	}
	racks, zones, spot := map[string]int{}, map[string]bool{}, 0
	slots := map[int]bool{}
	for _, n := range p.Nodes {
		racks[n.Rack]++
		zones[n.Zone] = true
		if n.Spot {
			spot++
			slots[n.Slot] = true
		} else if n.Slot != -1 {
			t.Errorf("on-demand node %s has spot slot %d", n.Name, n.Slot)
		}
	}
	// 10 nodes in racks of 4: 4 + 4 + 2; racks alternate over 2 zones;
	// floor(10 * 0.3) = 3 spot nodes, numbered 0..2.
	if want := map[string]int{"rack-0": 4, "rack-1": 4, "rack-2": 2}; !reflect.DeepEqual(racks, want) {
		t.Errorf("racks = %v, want %v", racks, want)
	}
	if len(zones) != 2 {
		t.Errorf("zones = %v, want 2", zones)
	}
	if spot != 3 || !reflect.DeepEqual(slots, map[int]bool{0: true, 1: true, 2: true}) {
		t.Errorf("spot nodes = %d with slots %v, want 3 with slots 0..2", spot, slots)
	}
}

func TestExpandJobs(t *testing.T) {
	p, err := mustParse(t, tiny).Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 3+20 {
		t.Fatalf("got %d jobs, want 23 (3 from the wave, 20 Poisson)", len(p.Jobs))
	}
	for i, j := range p.Jobs {
		if j.Seq != i {
			t.Errorf("job %d has Seq %d", i, j.Seq)
		}
		if i > 0 && j.Submit < p.Jobs[i-1].Submit {
			t.Errorf("job %s submitted before its predecessor", j.Name)
		}
		if j.Submit%(10*time.Second) != 0 || j.Duration%(10*time.Second) != 0 {
			t.Errorf("job %s: submit %s, duration %s not on the 10s tick", j.Name, j.Submit, j.Duration)
		}
		if !strings.HasPrefix(j.Name, "j") || !strings.HasSuffix(j.Name, "x"+strconv.FormatInt(j.GPUs, 10)) {
			t.Errorf("job name %q does not end in its shape", j.Name)
		}
	}
	// The wave is at 5s, rounded up to the 10s tick, in listed order.
	if got := []int{p.Jobs[0].Workers, p.Jobs[1].Workers, p.Jobs[2].Workers}; !reflect.DeepEqual(got, []int{4, 4, 3}) || p.Jobs[0].Submit != 10*time.Second {
		t.Errorf("first jobs = %v at %s, want the wave [4 4 3] at 10s", got, p.Jobs[0].Submit)
	}
	for _, j := range p.Jobs[3:] {
		if j.Duration < time.Minute || j.Duration > 10*time.Minute {
			t.Errorf("job %s duration %s outside [1m, 10m]", j.Name, j.Duration)
		}
		if j.Policy != "avoid" && j.Policy != "forbid" {
			t.Errorf("job %s policy %q", j.Name, j.Policy)
		}
	}
}

func TestExpandReclaims(t *testing.T) {
	p, err := mustParse(t, tiny).Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Reclaims) == 0 {
		t.Fatal("no reclaims in an hour at one every 5 minutes")
	}
	zoneOfSlot := map[int]string{}
	for _, n := range p.Nodes {
		if n.Spot {
			zoneOfSlot[n.Slot] = n.Zone
		}
	}
	for _, r := range p.Reclaims {
		if r.At >= time.Hour {
			t.Errorf("reclaim at %s, after the churn window", r.At)
		}
		if len(r.Slots) == 0 || len(r.Slots) > 2 {
			t.Errorf("reclaim at %s takes %d nodes, want 1 or 2", r.At, len(r.Slots))
		}
		for _, slot := range r.Slots {
			if zoneOfSlot[slot] != zoneOfSlot[r.Slots[0]] {
				t.Errorf("reclaim at %s spans zones", r.At)
			}
		}
	}
}

// Every shipped scenario must parse and expand.
func TestShippedScenarios(t *testing.T) {
	files, err := filepath.Glob("../../../bench/scenarios/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			s, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimSuffix(filepath.Base(f), ".yaml"); s.Name != want {
				t.Errorf("name %q, want the file name %q", s.Name, want)
			}
			p, err := s.Expand(1)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Nodes) != s.Cluster.Nodes || len(p.Jobs) == 0 {
				t.Errorf("expanded to %d nodes and %d jobs", len(p.Nodes), len(p.Jobs))
			}
		})
	}
}

// The equal-work scenarios are contention-free for every seed make bench
// runs: at no instant do running jobs ask for more than a third of the
// GPUs, and every gang fits in one rack (so TAS's rack constraint holds).
func TestEqualWorkScenariosAreContentionFree(t *testing.T) {
	files, err := filepath.Glob("../../../bench/scenarios/equal-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no equal-work scenarios: %v", err)
	}
	for _, f := range files {
		s, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		for seed := uint64(1); seed <= 5; seed++ {
			p, err := s.Expand(seed)
			if err != nil {
				t.Fatal(err)
			}
			type change struct {
				at   time.Duration
				gpus int64
			}
			var changes []change
			rackGPUs := int64(s.Cluster.NodesPerRack) * s.Cluster.GPUsPerNode
			for _, j := range p.Jobs {
				gpus := int64(j.Workers) * j.GPUs
				if gpus > rackGPUs {
					t.Errorf("%s seed %d: job %s needs %d GPUs, more than a rack's %d", s.Name, seed, j.Name, gpus, rackGPUs)
				}
				changes = append(changes, change{j.Submit, gpus}, change{j.Submit + j.Duration, -gpus})
			}
			// Completions before arrivals at the same instant, as the simulator applies them.
			sort.Slice(changes, func(a, b int) bool {
				if changes[a].at != changes[b].at {
					return changes[a].at < changes[b].at
				}
				return changes[a].gpus < changes[b].gpus
			})
			var inUse, peak int64
			for _, c := range changes {
				inUse += c.gpus
				peak = max(peak, inUse)
			}
			if limit := p.TotalGPUs() / 3; peak > limit {
				t.Errorf("%s seed %d: %d GPUs in use at the peak, more than a third (%d) of the cluster", s.Name, seed, peak, limit)
			}
		}
	}
}
