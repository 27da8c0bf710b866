package mustergang

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"

	"github.com/muster-sched/muster/pkg/gang"
)

// A gang placed whole gets one Event, on its Job: GangScheduled, naming the
// placement. Its plan is in the log and the gang's outcome (the PodGroup
// condition), not an Event of its own: on a burst of gangs every Event is an
// API call.
func TestPlacedGangGetsOneEvent(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b})
	_, plan := f.planAndWait(t, a)
	key, _ := gang.KeyOf(a)
	outcome, _ := f.plugin.gangs.LastNotice(key)
	assert.Equal(t, gang.OutcomePlanned, outcome, "the plan is the gang's outcome")
	assert.Empty(t, f.takeEvents(), "a plan is an Event")

	state, status := f.preFilter(t, b)
	require.True(t, status.IsSuccess(), "PreFilter: %v", status)
	slot := plan.Slots[b.UID]
	require.True(t, f.fw.RunReservePluginsReserve(context.Background(), state, b, slot).IsSuccess())
	_, st := f.fw.RunPermitPlugins(context.Background(), state, b, slot)
	require.True(t, st.IsSuccess(), "Permit of the last member: %v", st)

	events := f.takeEvents()
	require.Len(t, events, 1, "events: %q", events)
	assert.True(t, strings.HasPrefix(events[0], "Normal GangScheduled Scheduling gang ns/g: all 2 planned members reserved on 2 nodes in "), events[0])
	assert.Contains(t, events[0], "{kind=Job,apiVersion=batch/v1}", "the Event is on the gang's Job")
}
