package sim

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/muster-sched/muster/pkg/sim/scenario"
)

func testEngine(horizon time.Duration) *engine {
	return newEngine(&scenario.Scenario{Tick: scenario.D(time.Second), Horizon: scenario.D(horizon)})
}

// taken is what one step took from the engine: its instant and the kinds
// of its events, in order.
type taken struct {
	at    time.Duration
	kinds []int
}

// drain runs the engine's loop with a step that takes every event due and
// binds nothing; pods wait in the unschedulable pool while waiting says so.
func drain(t *testing.T, eng *engine, waiting func() bool) ([]taken, stop) {
	t.Helper()
	var steps []taken
	why, err := eng.run(context.Background(), func(_ context.Context, at time.Duration) (int, error) {
		eng.steps++
		eng.begin(at)
		s := taken{at: at}
		for {
			e, ok := eng.due()
			if !ok {
				break
			}
			if e.kind == evFlush {
				eng.flushing()
			}
			s.kinds = append(s.kinds, e.kind)
		}
		steps = append(steps, s)
		return 0, nil
	}, waiting)
	require.NoError(t, err)
	return steps, why
}

// Every event due at one instant is taken in one step, in kind order
// (completions free capacity before nodes change and jobs arrive), and the
// virtual clock follows the steps.
func TestEngineStepsTakeAnInstantsEventsInKindOrder(t *testing.T) {
	eng := testEngine(time.Hour)
	for _, e := range []event{
		{at: 10 * time.Second, kind: evArrival, seq: 1},
		{at: 10 * time.Second, kind: evNotice},
		{at: 5 * time.Second, kind: evArrival},
		{at: 10 * time.Second, kind: evComplete},
		{at: 10 * time.Second, kind: evArrival, seq: 0},
	} {
		eng.push(e)
	}
	steps, why := drain(t, eng, func() bool { return false })
	assert.Equal(t, drained, why)
	assert.Equal(t, []taken{
		{at: 5 * time.Second, kinds: []int{evArrival}},
		{at: 10 * time.Second, kinds: []int{evComplete, evNotice, evArrival, evArrival}},
	}, steps)
	assert.Equal(t, epoch.Add(10*time.Second), eng.clock.Now())
	assert.Equal(t, uint64(2), eng.steps)
}

// The loop stops before an event beyond the horizon, which stays queued.
func TestEngineStopsAtTheHorizon(t *testing.T) {
	eng := testEngine(time.Minute)
	eng.push(event{at: 30 * time.Second, kind: evArrival})
	eng.push(event{at: 2 * time.Minute, kind: evArrival})
	steps, why := drain(t, eng, func() bool { return false })
	assert.Equal(t, beyondHorizon, why)
	assert.Len(t, steps, 1)
	assert.Equal(t, 1, eng.events.Len())
}

// Pods left unschedulable get a flush step unschedulableFlush later, unless
// an event comes first; a flush that binds nothing queues no other.
func TestEngineFlushesUnschedulablePods(t *testing.T) {
	eng := testEngine(time.Hour)
	eng.push(event{at: 0, kind: evArrival})
	steps, why := drain(t, eng, func() bool { return true })
	assert.Equal(t, drained, why)
	assert.Equal(t, []taken{
		{at: 0, kinds: []int{evArrival}},
		{at: unschedulableFlush, kinds: []int{evFlush}},
	}, steps)

	eng = testEngine(time.Hour)
	eng.push(event{at: 0, kind: evArrival})
	eng.push(event{at: time.Minute, kind: evArrival})
	steps, _ = drain(t, eng, func() bool { return true })
	assert.Equal(t, []taken{
		{at: 0, kinds: []int{evArrival}},
		{at: time.Minute, kinds: []int{evArrival}},
		{at: time.Minute + unschedulableFlush, kinds: []int{evFlush}},
	}, steps, "the arrival a minute later comes first")

	eng = testEngine(time.Hour)
	eng.push(event{at: 0, kind: evArrival})
	steps, _ = drain(t, eng, func() bool { return false })
	assert.Len(t, steps, 1, "nothing waits: no flush")
}

// The clock may move up to, but not onto, the next event's instant.
func TestEngineBeforeNext(t *testing.T) {
	eng := testEngine(time.Hour)
	assert.True(t, eng.beforeNext(epoch.Add(time.Hour)), "no event left")
	eng.push(event{at: 10 * time.Second, kind: evArrival})
	assert.True(t, eng.beforeNext(epoch.Add(9*time.Second)))
	assert.False(t, eng.beforeNext(epoch.Add(10*time.Second)))
}
