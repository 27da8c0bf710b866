package mustergang

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// A gang short of members is explained (GangWaitingForMembers) only when it
// is still short membersGrace after a member was held: pods created one
// after another within the grace cost no Event and no status write.
func TestShortGangExplainedAfterTheGrace(t *testing.T) {
	a, b := worker("g", 0, 1, ""), worker("g", 1, 1, "")
	key, _ := gang.KeyOf(a)

	t.Run("still short", func(t *testing.T) {
		f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
		st := f.plugin.PreEnqueue(context.Background(), a)
		require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code(), "PreEnqueue: %v", st)
		assert.Contains(t, st.Message(), "has 2 of 3 members")
		outcome, _ := f.plugin.registry.LastNotice(key)
		assert.Empty(t, outcome, "explained before the grace ended")

		f.plugin.PreEnqueue(context.Background(), b) // a second held member arms no second check
		f.clock.Step(membersGrace - time.Millisecond)
		outcome, _ = f.plugin.registry.LastNotice(key)
		assert.Empty(t, outcome, "explained before the grace ended")
		f.clock.Step(time.Millisecond) // the fake clock runs the check within Step
		outcome, msg := f.plugin.registry.LastNotice(key)
		assert.Equal(t, gang.OutcomeWaitingForMembers, outcome, "not explained after the grace")
		assert.Contains(t, msg, "has 2 of 3 members")
		assert.False(t, f.clock.HasWaiters(), "a second check is pending")
	})

	t.Run("complete within the grace", func(t *testing.T) {
		c := worker("g", 2, 1, "")
		f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
		require.Equal(t, fwk.UnschedulableAndUnresolvable, f.plugin.PreEnqueue(context.Background(), a).Code())
		require.NoError(t, f.plugin.pods.Add(c)) // the third member arrives
		f.clock.Step(membersGrace)
		assert.False(t, f.clock.HasWaiters(), "the check is still pending")
		outcome, _ := f.plugin.registry.LastNotice(key)
		assert.Empty(t, outcome, "a gang that was complete when the grace ended was explained")
	})
}
