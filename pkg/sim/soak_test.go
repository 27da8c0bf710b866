package sim

import (
	"context"
	"runtime"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Running the scheduler again and again in one process leaks neither
// goroutines nor memory: after each run the scheduler, its informers and
// muster's plugin goroutines stop.
func TestRepeatedRunsDoNotLeak(t *testing.T) {
	plan := smallPlan(t, 1)
	settle := func() (int, uint64) {
		var goroutines int
		// Stopped goroutines take a moment to return; wait until the count
		// stops falling rather than sleeping a fixed time.
		_ = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			n := runtime.NumGoroutine()
			done := n == goroutines
			goroutines = n
			return done, nil
		})
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return goroutines, m.HeapInuse
	}
	run(t, plan, Muster)
	baseG, baseHeap := settle()
	var g int
	var heap uint64
	for i := range 3 {
		run(t, plan, Muster)
		g, heap = settle()
		t.Logf("after run %d: %d goroutines (first run %d), heap in use %.1f MiB (first run %.1f MiB)", i+2, g, baseG, float64(heap)/(1<<20), float64(baseHeap)/(1<<20))
	}
	if g > baseG+5 {
		t.Errorf("goroutines grew from %d to %d over 3 more runs", baseG, g)
	}
	if heap > 2*baseHeap+16<<20 {
		t.Errorf("heap in use grew from %.1f MiB to %.1f MiB", float64(baseHeap)/(1<<20), float64(heap)/(1<<20))
	}
}
