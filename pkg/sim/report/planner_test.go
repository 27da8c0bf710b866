package report

import (
	"strings"
	"testing"
)

// The planner table reads `go test -bench -count N` output: one row per
// case with the median and range of its runs, the filter check of the
// same gang beside the plan's (under its old name too), and the verdict against the target of its
// cluster size.
func TestPlannerTable(t *testing.T) {
	out := `goos: linux
pkg: github.com/muster-sched/muster/pkg/gang
BenchmarkCompute/nodes=5000/8x8gpu-avoid-2         	    2823	    400000 ns/op	  239396 B/op	     154 allocs/op
BenchmarkCompute/nodes=5000/8x8gpu-avoid-2         	    2852	    600000 ns/op	  239292 B/op	     154 allocs/op
BenchmarkCompute/nodes=5000/8x8gpu-avoid-2         	    2852	    500000 ns/op	  239292 B/op	     154 allocs/op
BenchmarkCompute/nodes=15000/64x8gpu-avoid-2       	     900	   2500000 ns/op
PASS
pkg: github.com/muster-sched/muster/pkg/plugins/mustergang
BenchmarkPlanGang/nodes=1000/8x1gpu-2              	    1000	   1200000 ns/op
BenchmarkPlanGang/nodes=5000/8x1gpu-2              	    1000	   1000000 ns/op
BenchmarkPlanGang/nodes=5000/8x1gpu-onepernode-2   	    1000	   3000000 ns/op
   	    1000	   3400000 ns/op
   	    1000	   2000000 ns/op
BenchmarkFilterCheck/nodes=5000/8x1gpu-2              	    1000	   250000 ns/op
BenchmarkFrameworkFloor/nodes=5000/8x1gpu-onepernode-2   	    1000	   1500000 ns/op
`
	var b strings.Builder
	plannerTable(&b, out)
	got := b.String()
	if strings.Contains(got, "| BenchmarkFrameworkFloor |") || strings.Contains(got, "| BenchmarkFilterCheck |") {
		t.Errorf("the filter check has rows of its own:\n%s", got)
	}
	for _, want := range []string{
		"| BenchmarkCompute | 5000 | 8x8gpu-avoid | 0.500 (0.400–0.600) | 3 | – | – | ≤ 1 ms: met |",
		"| BenchmarkCompute | 15000 | 64x8gpu-avoid | 2.500 | 1 | – | – | ≤ 2 ms: **not met** |",
		"| BenchmarkPlanGang | 1000 | 8x1gpu | 1.200 | 1 | – | – | – |",
		"| BenchmarkPlanGang | 5000 | 8x1gpu | 1.000 | 1 | 0.250 | 4.00× | ≤ 1 ms: met |",
		"BenchmarkCompute, slowest median at 5000 nodes: 0.500 ms",
		"BenchmarkCompute, slowest median at 15000 nodes: 2.500 ms",
		"| BenchmarkPlanGang | 5000 | 8x1gpu-onepernode | 3.000 (2.000–3.400) | 3 | 1.500 | 2.00× | ≤ 1 ms: **not met** |",
		"BenchmarkPlanGang, slowest median at 5000 nodes: 3.000 ms (target ≤ 1 ms).",
		"Targets not met: 2 of 4 cases.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	b.Reset()
	plannerTable(&b, "PASS\n")
	if b.Len() != 0 {
		t.Errorf("no benchmark lines, yet a table:\n%s", b.String())
	}
}
