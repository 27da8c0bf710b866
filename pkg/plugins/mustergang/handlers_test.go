package mustergang

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/gang"
)

// TestOwnerChangeWakesItsGang: a Job's change reaches its pending members
// through the plugin's own Job informer, and only a change that can alter
// the quorum (spec, finished members) wakes them.
func TestOwnerChangeWakesItsGang(t *testing.T) {
	// Gang g's pods and Job are put straight into the stores: the informers'
	// initial list (which may be delivered at any time) wakes nothing of g.
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{worker("g", 0, 1, ""), worker("g", 1, 1, "")})
	job := gangJob("g", 2)
	job.Generation = 1
	with := func(change func(*batchv1.Job)) *batchv1.Job {
		j := job.DeepCopy()
		change(j)
		return j
	}
	for _, tc := range []struct {
		name     string
		old, new *batchv1.Job
		wake     bool
	}{
		{"own Job added", nil, job, true},
		{"parallelism raised", job, with(func(j *batchv1.Job) { j.Generation = 2; j.Spec.Parallelism = ptr.To[int32](3) }), true},
		{"status write that changes no count", job, with(func(j *batchv1.Job) { j.Status.Active = 2 }), false},
		{"a member succeeded", job, with(func(j *batchv1.Job) { j.Status.Succeeded = 1 }), true},
		{"an index failed for good", job, with(func(j *batchv1.Job) { j.Status.FailedIndexes = ptr.To("1") }), true},
		{"another Job added", nil, gangJob("other", 2), false},
		{"same name, another namespace", nil, with(func(j *batchv1.Job) { j.Namespace = "elsewhere" }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.queue.mu.Lock()
			f.queue.activated = nil
			f.queue.mu.Unlock()
			handler := f.plugin.ownerHandler(gang.KindJob)
			if tc.old == nil {
				handler.OnAdd(tc.new, false)
			} else {
				handler.OnUpdate(tc.old, tc.new)
			}
			f.queue.mu.Lock()
			defer f.queue.mu.Unlock()
			if tc.wake {
				assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.queue.activated)
			} else {
				assert.Empty(t, f.queue.activated)
			}
		})
	}
}

func unstructuredOwner(kind, namespace, name string, generation int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	u.SetGeneration(generation)
	return u
}

func podGroupWithSucceeded(n int64) *unstructured.Unstructured {
	u := unstructuredOwner("PodGroup", "ns", "pg", 1)
	if err := unstructured.SetNestedField(u.Object, n, "status", "succeeded"); err != nil {
		panic(err)
	}
	return u
}

// TestPodGroupQuorumChanges: a PodGroup update wakes its gang only when its
// spec or its count of succeeded members changed (status writes, muster's
// own included, do not).
func TestPodGroupQuorumChanges(t *testing.T) {
	specChanged := podGroupWithSucceeded(0)
	specChanged.SetGeneration(2)
	for _, tc := range []struct {
		name     string
		old, new *unstructured.Unstructured
		want     bool
	}{
		{"status write", podGroupWithSucceeded(0), podGroupWithSucceeded(0), true},
		{"a member succeeded", podGroupWithSucceeded(0), podGroupWithSucceeded(1), false},
		{"spec changed", podGroupWithSucceeded(0), specChanged, false},
	} {
		assert.Equal(t, tc.want, quorumUnchanged(tc.old, tc.new), tc.name)
	}
}

// A gang whose last pod is gone leaves no timer behind: the backoff after
// its dropped plan would wake nobody (or a new gang of the same name)
// later, and in the simulator each pending timer is a moment the virtual
// clock moves to.
func TestForgottenGangLeavesNoTimer(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	f.planAndWait(t, a)
	f.plugin.drop(context.Background(), key, 0, gang.DropRejected, "test")
	require.True(t, f.clock.HasWaiters(), "the backoff is pending")
	for _, pod := range []*v1.Pod{a, b} {
		require.NoError(t, f.plugin.source.pods.Delete(pod))
		f.plugin.onPodDelete(pod)
	}
	assert.False(t, f.clock.HasWaiters(), "a timer of the forgotten gang is pending")
	assert.Equal(t, gang.PhaseNew, f.plugin.gangs.Phase(key), "the gang is forgotten")
}
