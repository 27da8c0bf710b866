package sim

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

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

// Bindings that fail after a gang was allowed (an API server error) are
// retried by the scheduler: every gang still completes, none is left partly
// bound at the end, and the failed members are placed again.
func TestBindFailuresAreRetried(t *testing.T) {
	var mu sync.Mutex
	failed := map[string]bool{}
	fault := func(pod *v1.Pod, node string) error {
		mu.Lock()
		defer mu.Unlock()
		// The first binding of every gang's index-1 member fails once.
		if strings.HasSuffix(pod.Name, "-1") && !failed[pod.Name] {
			failed[pod.Name] = true
			return apierrors.NewServiceUnavailable("injected bind failure")
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	droppedBefore := musterCounter(t, "muster_gang_rejections_total", "cause", true)
	r, err := Run(ctx, Options{Plan: smallPlan(t, 1), Scheduler: Muster, StepTimeout: time.Minute, BindFault: fault})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	injected := len(failed)
	mu.Unlock()
	if injected == 0 {
		t.Fatal("no binding failure was injected: the test tests nothing")
	}
	m := r.Metrics
	t.Logf("%d bind failures injected; gangs %d/%d completed, %d ever partial, %d partial at the end; clock moved %d times past pod backoff, %d times to muster's timers",
		injected, m.GangsCompleted, m.GangsTotal, m.PartialGangs, m.DeadlockedGangs, r.Details.ClockMovesPodBackoff, r.Details.ClockMovesGangBackoff)
	if m.GangsCompleted != m.GangsTotal || m.DeadlockedGangs != 0 {
		t.Errorf("with bind failures: %d/%d gangs completed, %d partly bound at the end", m.GangsCompleted, m.GangsTotal, m.DeadlockedGangs)
	}
	// A binding fails after its gang was released: the plan is complete
	// by then, so muster drops nothing and backs nothing off (a dropped
	// plan is TestGangBackoffRunsOnTheVirtualClock's). The framework retries
	// the member itself and muster places it alone beside its bound
	// siblings. The first wave fits at once, so every gang of it is still
	// placed in the step it arrived in.
	for cause, n := range musterCounter(t, "muster_gang_rejections_total", "cause", true) {
		if n != droppedBefore[cause] {
			t.Errorf("muster_gang_rejections_total{cause=%q} went from %.0f to %.0f: a failed binding dropped a plan", cause, droppedBefore[cause], n)
		}
	}
	for _, g := range r.Gangs {
		if g.Submitted == 0 && g.Placed != 0 {
			t.Errorf("gang %s (submitted at 0) was placed at %.0fs, not in its own step", g.Name, g.Placed)
		}
	}
}

// A day of a churning, full cluster (bench/scenarios/soak-day.yaml: spot
// nodes replaced under new names, jobs of two priorities arriving, preempting
// and finishing, a tenth of the Jobs refusing every patch) leaves nothing behind in
// muster: once every job is done, each structure keyed by gang, pod or
// victim is empty, and those keyed by node or domain hold no more than the
// nodes present (the topology index forgets replaced nodes once they
// dominate, so it may keep up to twice the fleet plus 1024).
//
// The run also writes a heap profile at each sample and a CPU profile of
// each period between two, and its recorder keeps no finished job.
func TestSoakLeavesNothingBehind(t *testing.T) {
	profiles := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Run(ctx, Options{Plan: benchPlan(t, "soak-day.yaml", 1), Scheduler: Muster, StepTimeout: time.Minute,
		HeapProfiles: profiles, CPUProfiles: profiles})
	require.NoError(t, err)
	d := r.Details
	require.NotEmpty(t, d.Soak)
	last := d.Soak[len(d.Soak)-1]
	require.Equal(t, last.JobsSubmitted, last.JobsFinished, "the run ends with every job done: %s", d.EndReason)
	assert.Empty(t, r.Gangs, "a soak's recorder logs the unfinished gangs only")
	every := benchPlan(t, "soak-day.yaml", 1).Scenario.Soak.SampleEvery.Duration
	for _, s := range d.Soak[:len(d.Soak)-1] {
		at := time.Duration(s.VirtualHours * float64(time.Hour))
		for _, name := range []string{fmt.Sprintf("muster.heap-%04.0fh.pprof", at.Hours()), fmt.Sprintf("muster.cpu-%04.0fh.pprof", (at + every).Hours())} {
			info, err := os.Stat(filepath.Join(profiles, name))
			if assert.NoError(t, err, "no profile %s", name) {
				assert.Positive(t, info.Size(), "%s is empty", name)
			}
		}
	}
	// The last period's CPU profile was stopped: another may start.
	require.NoError(t, pprof.StartCPUProfile(io.Discard))
	pprof.StopCPUProfile()
	assert.Positive(t, last.NodesReplaced, "no spot node was replaced")
	assert.Positive(t, d.RefusedJobPatches, "no failed-plan record was refused")
	require.NotNil(t, d.Preemption)
	assert.Positive(t, d.Preemption.PodsEvicted, "no gang preempted")
	peak := map[string]int{}
	for _, s := range d.Soak {
		for k, n := range s.Structures {
			peak[k] = max(peak[k], n)
		}
	}
	// What the scheduler did is sampled with the structures, so a
	// slowdown over the soak shows (plans are timed in real time).
	assert.Positive(t, last.Attempts, "no scheduling attempt counted")
	assert.Positive(t, last.Plans, "no plan counted")
	assert.Positive(t, last.PlanSeconds, "plans took no time")
	assert.Positive(t, last.BusySeconds, "the scheduler was never busy")
	assert.Positive(t, peak["gangs"], "no gang was ever known")
	assert.Positive(t, peak["pending members' facts"], "no pending member was ever gathered")
	for _, k := range []string{"gangs", "gangs planned", "gangs unplaceable", "victims awaited", "members in flight", "members succeeded",
		"gangs' preempted pods", "avoided (member, node) pairs", "failed-plan records", "failed-plan queue", "status queue", "timers named", "timers live", "pending members' facts"} {
		n, ok := last.Structures[k]
		require.True(t, ok, "muster reports no %q", k)
		assert.Zero(t, n, "%s once every job is done (peak %d)", k, peak[k])
	}
	for _, k := range []string{"node views", "node classes", "DRA nodes", "DRA slices"} {
		assert.LessOrEqual(t, last.Structures[k], last.Nodes, "%s: more than the nodes present", k)
	}
	for _, k := range []string{"topology nodes", "topology domains"} {
		assert.LessOrEqual(t, last.Structures[k], 3*last.Nodes+1024, "%s", k)
	}
}
