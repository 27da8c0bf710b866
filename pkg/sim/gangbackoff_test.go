package sim

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// reserveMark is one reservation of the faulted gang: on the virtual clock
// and on the real one.
type reserveMark struct {
	virtual, real time.Time
}

// gangFault fails the second reservation of one gang's plan (one member
// then waits at Permit and is rejected with it) for the gang's first
// plans, and records when each failed and when the gang's next reservation
// (its retry) came.
type gangFault struct {
	drops int // how many plans to drop

	mu      sync.Mutex
	gang    string // the Job whose reservations fail: the first one reserved
	inPlan  int    // reservations in the gang's current plan
	faults  []reserveMark
	retries []reserveMark
}

func (f *gangFault) reserve(pod *v1.Pod, _ string, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	job := pod.Labels[batchv1.JobNameLabel]
	if f.gang == "" {
		f.gang = job
	}
	if job != f.gang {
		return nil
	}
	mark := reserveMark{virtual: now, real: time.Now()}
	if f.inPlan == 0 && len(f.retries) < len(f.faults) {
		f.retries = append(f.retries, mark)
	}
	f.inPlan++
	if f.inPlan < 2 || len(f.faults) == f.drops {
		return nil
	}
	f.inPlan = 0
	f.faults = append(f.faults, mark)
	return errors.New("injected reservation failure")
}

// musterGangArgs are the MusterGang args of the shipped profile.
func musterGangArgs(t *testing.T) *config.MusterGangArgs {
	t.Helper()
	cfg, err := MusterConfig()
	require.NoError(t, err)
	for _, pc := range cfg.Profiles[0].PluginConfig {
		if args, ok := pc.Args.(*config.MusterGangArgs); ok {
			return args
		}
	}
	t.Fatal("the shipped profile has no MusterGang args")
	return nil
}

// musterCounter reads one of muster's counters by label from the process's
// registry (the plugin's metrics add up across the runs of one process).
// Before muster has counted anything in this process the counter has no
// series: that reads as empty when allowed.
func musterCounter(t *testing.T, name, label string, mayBeEmpty bool) map[string]float64 {
	t.Helper()
	values, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer, name, nil, label)
	if err != nil && mayBeEmpty {
		require.ErrorContains(t, err, "not found")
		return map[string]float64{}
	}
	require.NoError(t, err)
	return values
}

// A gang whose plan muster drops backs off on the virtual clock: twice in a
// row here (gangBackoffSeconds, then twice that), in the step it arrived
// in. The simulator moves its clock to the plugin's backoff timer instead of
// waiting for it, so the gang is retried exactly when its backoff ends in
// virtual time, and the run ends with every gang placed whole, the faulted
// one in the step it arrived in. On the real clock the retry would come at
// some later step's virtual time (or, here, never: the run ends first). The
// real time between drop and retry is logged, not asserted: timing is not a
// test's business.
func TestGangBackoffRunsOnTheVirtualClock(t *testing.T) {
	base := time.Duration(musterGangArgs(t).GangBackoffSeconds) * time.Second
	require.Positive(t, base)
	fault := &gangFault{drops: 2}
	wakesBefore := musterCounter(t, "muster_gang_wakes_total", "reason", true)
	droppedBefore := musterCounter(t, "muster_gang_rejections_total", "cause", true)
	plan := smallPlan(t, 1)

	r, err := Run(t.Context(), Options{Plan: plan, Scheduler: Muster, StepTimeout: time.Minute, ReserveFault: fault.reserve})
	require.NoError(t, err)

	fault.mu.Lock()
	defer fault.mu.Unlock()
	require.NotEmpty(t, fault.faults, "no reservation failed: the test tests nothing")
	assert.Len(t, fault.faults, fault.drops, "plans of gang %s dropped", fault.gang)
	assert.Len(t, fault.retries, len(fault.faults), "retries of gang %s after its plan was dropped", fault.gang)
	backoff := base
	for i := range fault.retries {
		failed, retried := fault.faults[i], fault.retries[i]
		t.Logf("gang %s: plan dropped at virtual +%s, retried at +%s (backoff %s) after %s of real time",
			fault.gang, failed.virtual.Sub(epoch), retried.virtual.Sub(epoch), backoff, retried.real.Sub(failed.real))
		assert.Equal(t, backoff, retried.virtual.Sub(failed.virtual),
			"drop %d: the retry is not exactly one backoff later in virtual time", i+1)
		backoff *= 2 // each drop in a row doubles the backoff
	}

	// The harness moved the clock once per drop, and counted both drops.
	assert.Equal(t, fault.drops, r.Details.ClockMovesGangBackoff)
	assert.Equal(t, float64(fault.drops), r.Details.Extra["muster_plans_dropped_rejected"])
	assert.Zero(t, r.Details.Extra["muster_plans_dropped_timeout"])
	// The plugin counted them too: plans dropped because a member was
	// rejected, and wakes when a backoff ended.
	dropped := musterCounter(t, "muster_gang_rejections_total", "cause", false)["rejected"] - droppedBefore["rejected"]
	assert.Equal(t, float64(fault.drops), dropped, "muster_gang_rejections_total{cause=rejected}")
	woken := musterCounter(t, "muster_gang_wakes_total", "reason", false)["backoff_ended"] - wakesBefore["backoff_ended"]
	assert.Equal(t, float64(fault.drops), woken, "muster_gang_wakes_total{reason=backoff_ended}")

	m := r.Metrics
	assert.Equal(t, m.GangsTotal, m.GangsCompleted, "gangs completed (%s)", r.Details.EndReason)
	assert.Zero(t, m.PartialGangs, "gangs ever partly bound")
	assert.Zero(t, m.DeadlockedGangs, "gangs partly bound at the end")
	assert.Zero(t, r.Details.StalledSteps)
	assert.Equal(t, plan.TotalPods(), r.Details.PodsBound)
	for _, g := range r.Gangs {
		if g.Name == fault.gang {
			assert.Equal(t, g.Submitted, g.Placed, "gang %s was not placed in the step it arrived in", g.Name)
		}
	}
}
