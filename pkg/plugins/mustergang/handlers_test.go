package mustergang

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
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
	assert.Equal(t, gang.PhasePending, f.plugin.gangs.Phase(key), "the gang is forgotten")
}

// A PodGroup's gang lives as long as its object, not only its pods: the
// last member's success, recorded after it left the informer, still
// counts, and once the PodGroup is deleted nothing of it remains for a new
// PodGroup of the same name to inherit (its quorum would be short of the
// finished member).
func TestPodGroupGangEndsWithItsObject(t *testing.T) {
	done := worker("pg", 0, 1, "n1")
	done.OwnerReferences = nil
	done.Labels[v1alpha1.PodGroupLabel] = "pg"
	f := newQuietFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{done})
	key, _ := gang.KeyOf(done)
	groups := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	group := &unstructured.Unstructured{}
	group.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
	group.SetKind("PodGroup")
	group.SetNamespace("ns")
	group.SetName("pg")
	require.NoError(t, groups.Add(group))
	f.plugin.source.podGroups = cache.NewGenericLister(groups, v1alpha1.Resource.GroupResource())
	f.plugin.source.podGroupsSynced = func() bool { return true }
	finished := done.DeepCopy()
	finished.Status.Phase = v1.PodSucceeded
	f.plugin.handle.ClientSet().(*fake.Clientset).PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, finished, nil
	})
	f.plugin.gangs.FirstSeen(key, t0)

	// The member finished and left the informer; its success is read from
	// the API server after that.
	require.NoError(t, f.plugin.source.pods.Delete(done))
	f.plugin.onPodDelete(done)
	f.plugin.recordFinished(key, done)
	assert.Equal(t, 1, f.plugin.gangs.Succeeded(key), "the PodGroup stands: its finished member counts")

	require.NoError(t, groups.Delete(group))
	f.plugin.ownerHandler(gang.KindPodGroup).OnDelete(group)
	assert.Zero(t, f.plugin.gangs.Succeeded(key), "the deleted PodGroup's gang is forgotten")
	_, known := f.plugin.gangs.Forget(key, t0)
	assert.False(t, known, "nothing of the gang was left")
}

func TestBoundMemberLeavingBreaksThePlanThatCountedOnIt(t *testing.T) {
	// A Job of three: a runs on n1, its siblings are planned beside it (two
	// slots: the quorum counts a). a fails, or starts terminating (drained
	// with a long grace period to checkpoint), before the plan completes:
	// the plan would bind two of three, so it is dropped and b, waiting at
	// Permit, is rejected; the next plan places all three again.
	for _, tc := range []struct {
		name  string
		leave func(f *testFramework, a *v1.Pod)
	}{
		{"deleted", func(f *testFramework, a *v1.Pod) {
			require.NoError(t, f.plugin.source.pods.Delete(a))
			f.plugin.onPodDelete(a)
		}},
		{"terminating", func(f *testFramework, a *v1.Pod) {
			terminating := a.DeepCopy()
			terminating.DeletionTimestamp = &metav1.Time{Time: f.clock.Now()}
			require.NoError(t, f.plugin.source.pods.Update(terminating))
			f.plugin.onPodUpdate(a, terminating)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := worker("j", 0, 8, "n1")
			b, c := worker("j", 1, 8, ""), worker("j", 2, 8, "")
			background := append(cpuPods("n1", 5), cpuPods("n2", 5)...) // priority-0 CPU pods, as on a real cluster
			f := newTestFramework(t, 3, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8), gpuNode("n4", 8)}, append([]*v1.Pod{a, b, c}, background...))
			key, _ := gang.KeyOf(b)
			_, plan := f.planAndWait(t, b)
			require.Len(t, plan.Slots, 2, "the plan places b and c beside a")

			tc.leave(f, a)
			require.Nil(t, f.plugin.gangs.Plan(key), "the plan counted on a")
			st := f.fw.WaitOnPermit(context.Background(), b)
			assert.False(t, st.IsSuccess(), "b waiting at Permit: %v", st)
			assert.Contains(t, st.Message(), "member j-0 was deleted or finished")
		})
	}
}

// Once muster has listed the PodGroups (it starts to only when it becomes
// the leader), the pending members of every PodGroup gang are woken: until
// then PreEnqueue turned them away, and a PodGroup's own Add may have come
// before that, waking nobody. Members of other gangs and bound members are
// left alone.
func TestListedPodGroupsWakeTheirGangs(t *testing.T) {
	inGroup := func(p *v1.Pod) *v1.Pod {
		p.OwnerReferences = nil
		p.Labels[v1alpha1.PodGroupLabel] = "pg"
		return p
	}
	pods := []*v1.Pod{inGroup(worker("pg", 0, 1, "")), inGroup(worker("pg", 1, 1, "")), inGroup(worker("pg", 2, 1, "n1")),
		worker("job", 0, 1, "")}
	f := newQuietFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, nil, pods)
	groups := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	listed := false
	f.plugin.source.podGroups = cache.NewGenericLister(groups, v1alpha1.Resource.GroupResource())
	f.plugin.source.podGroupsSynced = func() bool { return listed }

	for _, pod := range pods[:2] {
		st := f.plugin.PreEnqueue(context.Background(), pod)
		require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code(), "PreEnqueue of %s: %v", pod.Name, st)
		assert.Contains(t, st.Message(), "not finished listing PodGroups", "a PodGroup not listed yet is not reported missing")
	}
	assert.Empty(t, f.takeEvents(), "an Event while muster lists PodGroups")

	listed = true
	f.takeActivated()
	f.plugin.wakePodGroupGangs()
	assert.ElementsMatch(t, []string{"ns/pg-0", "ns/pg-1"}, f.takeActivated())
}

// A slice's device is lost to a plan when it leaves the slice or gains a
// taint that keeps new pods off it or evicts them; a DeviceTaintRule
// selects devices by driver, pool and name.
func TestDevicesLostAndTainted(t *testing.T) {
	slice := func(taints ...resourceapi.DeviceTaint) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: "gpu.example.com", Pool: resourceapi.ResourcePool{Name: "n1"},
			Devices: []resourceapi.Device{{Name: "gpu-0", Taints: taints}, {Name: "gpu-1"}}}}
	}
	ecc := resourceapi.DeviceTaint{Key: "ecc", Value: "bad", Effect: resourceapi.DeviceTaintEffectNoExecute}
	fewer := slice()
	fewer.Spec.Devices = fewer.Spec.Devices[:1]
	for _, tc := range []struct {
		name     string
		old, new *resourceapi.ResourceSlice
		want     string
	}{
		{"unchanged", slice(), slice(), ""},
		{"device removed", slice(), fewer, "ResourceSlice s lost devices gpu-1"},
		{"tainted NoExecute", slice(), slice(ecc), "ResourceSlice s tainted devices gpu-0 (ecc=bad:NoExecute)"},
		{"tainted NoSchedule", slice(), slice(resourceapi.DeviceTaint{Key: "m", Effect: resourceapi.DeviceTaintEffectNoSchedule}), "ResourceSlice s tainted devices gpu-0 (m=:NoSchedule)"},
		{"taint with no effect on pods", slice(), slice(resourceapi.DeviceTaint{Key: "m", Effect: resourceapi.DeviceTaintEffectNone}), ""},
		{"taint already there", slice(ecc), slice(ecc), ""},
		{"taint removed", slice(ecc), slice(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, lostDevices(tc.old, tc.new))
		})
	}
	s := slice()
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, taintedBy(nil, s), "no selector: every device")
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, taintedBy(&resourceapi.DeviceTaintSelector{Driver: ptr.To("gpu.example.com"), Pool: ptr.To("n1")}, s))
	assert.Equal(t, []string{"gpu-1"}, taintedBy(&resourceapi.DeviceTaintSelector{Device: ptr.To("gpu-1")}, s))
	assert.Empty(t, taintedBy(&resourceapi.DeviceTaintSelector{Pool: ptr.To("n2")}, s), "another pool")
	assert.Empty(t, taintedBy(&resourceapi.DeviceTaintSelector{Driver: ptr.To("other.example.com")}, s), "another driver")
}
