package mustergang

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/muster-sched/muster/pkg/gang"
)

// The profiles of one scheduler share a gang manager; two schedulers built
// from one registry (as upstream's scheduler_perf builds one per workload)
// never do, and a scheduler's manager goes with its context.
func TestOneGangManagerPerScheduler(t *testing.T) {
	managers := &gangManagers{bySchedulers: map[informers.SharedInformerFactory]*gang.Manager{}}
	first, second := informers.NewSharedInformerFactory(fake.NewClientset(), 0), informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	ctx, stop := context.WithCancel(t.Context())
	profileA, profileB := managers.of(ctx, first), managers.of(ctx, first)
	assert.Same(t, profileA, profileB, "the profiles of one scheduler share its manager")
	assert.NotSame(t, profileA, managers.of(t.Context(), second), "another scheduler has its own")
	stop()
	require.Eventually(t, func() bool {
		managers.mu.Lock()
		defer managers.mu.Unlock()
		_, kept := managers.bySchedulers[first]
		return !kept
	}, 10*time.Second, time.Millisecond, "the stopped scheduler's manager is kept")
}
