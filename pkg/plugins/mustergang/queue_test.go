package mustergang

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// jobPod is member index of Job job, created at t0+created seconds.
func jobPod(job string, index int, created int, priority int32) *v1.Pod {
	return testobj.MakePod("ns", job+"-"+string(rune('0'+index))).UID(job+string(rune('0'+index))).
		Created(t0.Add(time.Duration(created)*time.Second)).OwnedByJob(job, "").Priority(priority).Obj()
}

func lonePod(name string, created int, priority int32) *v1.Pod {
	p := jobPod(name, 0, created, priority)
	p.OwnerReferences = nil
	p.Name = name
	return p
}

func queued(t *testing.T, pod *v1.Pod) fwk.QueuedEntityInfo {
	t.Helper()
	pi, err := framework.NewPodInfo(pod)
	if err != nil {
		t.Fatal(err)
	}
	// The queue's own timestamp changes on every requeue; Less must not use it.
	return &framework.QueuedPodInfo{PodInfo: pi, QueueingParams: framework.QueueingParams{Timestamp: time.Now()}}
}

func TestLessKeepsGangsTogetherInFirstSeenOrder(t *testing.T) {
	p := &Plugin{gangs: gang.NewManager()}
	// Gang "a" was seen first (its first member at t0+1), gang "b" at t0+2
	// (even though b's second member is older than a's second member).
	a0, a1 := jobPod("a", 0, 1, 0), jobPod("a", 1, 10, 0)
	b0, b1 := jobPod("b", 0, 2, 0), jobPod("b", 1, 3, 0)
	for _, pod := range []*v1.Pod{a0, b0} {
		key, _ := gang.KeyOf(pod)
		p.gangs.FirstSeen(key, pod.CreationTimestamp.Time)
	}
	lone := lonePod("lone", 5, 0)
	urgent := jobPod("urgent", 0, 100, 10)
	// A Kubernetes PodGroup queued as one entry, first seen between a and
	// b, its queue timestamp (now) later than every pod's creation.
	grouped := testobj.MakePod("ns", "pg-0").UID("pg-0").Created(t0.Add(1500 * time.Millisecond)).PodGroup("pg").Obj()
	groupKey, _ := gang.KeyOf(grouped)
	p.gangs.FirstSeen(groupKey, grouped.CreationTimestamp.Time)
	group := &framework.QueuedPodGroupInfo{
		PodGroupInfo:   &framework.PodGroupInfo{Namespace: "ns", Name: "pg", PodGroup: &schedulingv1beta1.PodGroup{}, UnscheduledPods: []*v1.Pod{grouped}},
		QueueingParams: framework.QueueingParams{Timestamp: time.Now()},
	}

	// The expected order: higher priority first; then gangs by first-seen
	// time, members of one gang together (by name); a lone pod by its own
	// creation time; a pod group where its members would be. One key for
	// every entry keeps the order transitive.
	entries := []fwk.QueuedEntityInfo{queued(t, urgent), queued(t, a0), queued(t, a1), group, queued(t, b0), queued(t, b1), queued(t, lone)}
	names := []string{"urgent", "a-0", "a-1", "group pg", "b-0", "b-1", "lone"}
	for i := range entries {
		for j := range entries {
			got := p.Less(entries[i], entries[j])
			if got != (i < j) {
				t.Errorf("Less(%s, %s) = %v, want %v", names[i], names[j], got, i < j)
			}
		}
	}
	// The key is stable: the registry's first-seen time does not move when
	// another member is seen later.
	key, _ := gang.KeyOf(a1)
	if got := p.gangs.FirstSeen(key, a1.CreationTimestamp.Time); !got.Equal(a0.CreationTimestamp.Time) {
		t.Errorf("first-seen of gang a moved to %v", got)
	}
}

func TestQueueingHints(t *testing.T) {
	p := &Plugin{gangs: gang.NewManager()}
	logger := klog.Background()
	member := jobPod("a", 0, 1, 0)
	sibling := jobPod("a", 1, 2, 0)
	stranger := jobPod("b", 0, 3, 0)
	lone := lonePod("lone", 4, 0)
	groupPod := lonePod("grouped", 5, 0)
	groupPod.Labels = map[string]string{"scheduling.x-k8s.io/pod-group": "pg"}

	// A pod hint's case: pod waits, other is the pod added or deleted.
	type podHint struct {
		name  string
		pod   *v1.Pod
		other interface{}
		want  fwk.QueueingHint
	}
	podHints := []podHint{
		{"sibling added", member, sibling, fwk.Queue},
		{"other gang's pod added", member, stranger, fwk.QueueSkip},
		{"lone pod added", member, lone, fwk.QueueSkip},
		{"lone pod is not woken by pods", lone, lonePod("other", 6, 0), fwk.QueueSkip},
		{"not a pod: queue when unsure", member, "garbage", fwk.Queue},
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"rack": "r1"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "a", Effect: v1.TaintEffectNoSchedule}}}}
	withTaint := node.DeepCopy()
	withTaint.Spec.Taints = append(withTaint.Spec.Taints, v1.Taint{Key: configv1.TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule})
	untainted := node.DeepCopy()
	untainted.Spec.Taints = nil
	relabelled := node.DeepCopy()
	relabelled.Labels["rack"] = "r2"
	cordoned := node.DeepCopy()
	cordoned.Spec.Unschedulable = true
	for _, tc := range []struct {
		name     string
		old, new interface{}
		want     fwk.QueueingHint
	}{
		{"node added", nil, node, fwk.Queue},
		{"reclaim taint added", node, withTaint, fwk.QueueSkip},
		{"node cordoned", node, cordoned, fwk.QueueSkip},
		{"node uncordoned", cordoned, node, fwk.Queue},
		{"taint removed", node, untainted, fwk.Queue},
		{"labels changed", node, relabelled, fwk.Queue},
	} {
		t.Run("node/"+tc.name, func(t *testing.T) {
			if got, err := nodeMayAddRoom(logger, member, tc.old, tc.new); err != nil || got != tc.want {
				t.Errorf("nodeMayAddRoom = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	for _, tc := range podHints {
		t.Run("pod/"+tc.name, func(t *testing.T) {
			got, err := p.sameGangPod(logger, tc.pod, nil, tc.other)
			if err != nil || got != tc.want {
				t.Errorf("sameGangPod = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestEventsToRegisterArePodsAndNodesOnly: owners' changes come through the
// plugin's own informers (TestOwnerChangeWakesItsGang); a registration for
// them would make the framework start a second, dynamic informer per kind.
func TestEventsToRegisterArePodsAndNodesOnly(t *testing.T) {
	p := &Plugin{gangs: gang.NewManager()}
	events, err := p.EventsToRegister(t.Context())
	require.NoError(t, err)
	resources := map[fwk.EventResource]bool{}
	for _, e := range events {
		resources[e.Event.Resource] = true
	}
	assert.Equal(t, map[fwk.EventResource]bool{fwk.UnscheduledPod: true, fwk.AssignedPod: true, fwk.Node: true}, resources)
}

// A member refused in the plan's filter check for another plugin's sake (a
// taint here) carries MusterGang's status, so the framework asks MusterGang's
// hints only: MusterGang registers the events of the profile's other
// PreFilter and Filter plugins with their hints, and a toleration added to
// the member requeues it as it would requeue a lone pod.
func TestEventsOfTheProfilesOtherPluginsWakeTheGang(t *testing.T) {
	f, _, a, _, status := refusedByATaint(t)
	assert.Equal(t, Name, status.Plugin(), "the framework attributes the taint's refusal to MusterGang")

	events, err := f.plugin.EventsToRegister(t.Context())
	require.NoError(t, err)
	tolerating := a.DeepCopy()
	tolerating.Spec.Tolerations = []v1.Toleration{{Key: "dedicated", Value: "training", Effect: v1.TaintEffectNoSchedule}}
	update := fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.UpdatePodToleration}
	// NodeUnschedulable's hint for the same event skips: the member still
	// does not tolerate a cordon.
	assert.True(t, requeuedBy(t, events, update, tolerating, a, tolerating),
		"a toleration added to the refused member requeues it (TaintToleration's event and hint)")

	// Only the refusers' events: the profile's binder and MusterGang's own
	// registrations are not repeated.
	own, err := (&Plugin{gangs: gang.NewManager()}).EventsToRegister(t.Context())
	require.NoError(t, err)
	others, err := f.plugin.profileEvents(t.Context())
	require.NoError(t, err)
	assert.Len(t, events, len(own)+len(others))
	for _, e := range others {
		assert.NotNil(t, e.QueueingHintFn, "event %v is registered with its plugin's hint", e.Event)
	}
}

// refusedByATaint is a gang of two 8-GPU workers of Job j on two 8-GPU
// nodes whose taint they do not tolerate, and the status of a's PreFilter:
// no plan.
func refusedByATaint(t *testing.T) (f *testFramework, taint v1.Taint, a, b *v1.Pod, status *fwk.Status) {
	t.Helper()
	taint = v1.Taint{Key: "dedicated", Value: "training", Effect: v1.TaintEffectNoSchedule}
	nodes := []*v1.Node{testobj.MakeNode("n1").GPUs(8).Taint(taint).Obj(), testobj.MakeNode("n2").GPUs(8).Taint(taint).Obj()}
	a, b = worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f = newTestFramework(t, 2, nodes, []*v1.Pod{a, b})
	_, status = f.preFilter(t, a)
	require.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code(), "PreFilter: %v", status)
	return f, taint, a, b, status
}

// A member's own invalid annotation does not let it past its gang's
// quorum: it waits at PreEnqueue like its siblings, and PreFilter explains
// the annotation once the gang is whole.
func TestMemberWithAnInvalidAnnotationWaitsForItsGang(t *testing.T) {
	a := worker("g", 0, 1, "")
	a.Annotations = map[string]string{gang.AnnotationTopologyRequired: "planet"}
	f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, worker("g", 1, 1, "")})
	st := f.plugin.PreEnqueue(context.Background(), a)
	require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code(), "PreEnqueue: %v", st)
	assert.Contains(t, st.Message(), "has 2 of 3 members")
}

// PreEnqueue keeps its count of a gang's pods only until the plugin's
// next pod event: a member added or deleted is counted at once.
func TestPreEnqueueCountsAgainAfterAPodEvent(t *testing.T) {
	a, b, c := worker("g", 0, 1, ""), worker("g", 1, 1, ""), worker("g", 2, 1, "")
	f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
	for range 2 {
		st := f.plugin.PreEnqueue(t.Context(), a)
		require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code(), "PreEnqueue: %v", st)
		assert.Contains(t, st.Message(), "has 2 of 3 members")
	}
	require.NoError(t, f.plugin.source.pods.Add(c))
	f.plugin.onPodAdd(c)
	assert.True(t, f.plugin.PreEnqueue(t.Context(), a).IsSuccess(), "the third member was added")

	require.NoError(t, f.plugin.source.pods.Delete(b))
	f.plugin.onPodDelete(b)
	st := f.plugin.PreEnqueue(t.Context(), a)
	require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code(), "PreEnqueue after a member left: %v", st)
	assert.Contains(t, st.Message(), "has 2 of 3 members")
}

// Of a gang waiting for room, an event that may make room requeues the
// member that leads it (the one whose cycle found no room), not every
// member: a bound pod's deletion skips the sibling. The sibling is requeued
// on its own answer when the lead's is Skip (an event only it cares
// about), and by every such event once the lead is gone.
func TestRoomEventsRequeueTheGangsLead(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{a, b})
	_, status := f.preFilter(t, a)
	require.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code(), "two members of 8 GPUs on one node of 8: %v", status)

	events, err := f.plugin.EventsToRegister(t.Context())
	require.NoError(t, err)
	freed := testobj.MakePod("ns", "done").Node("n1").Obj()
	deletion := fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}
	requeues := func(pod *v1.Pod) bool {
		t.Helper()
		return requeuedBy(t, events, deletion, pod, freed, nil)
	}
	assert.True(t, requeues(a), "the lead is requeued when a bound pod goes")
	assert.False(t, requeues(b), "the sibling waits for the lead's plan")

	onlyB := f.plugin.throughLead(func(_ klog.Logger, pod *v1.Pod, _, _ interface{}) (fwk.QueueingHint, error) {
		if pod.UID == b.UID {
			return fwk.Queue, nil
		}
		return fwk.QueueSkip, nil
	}, false)
	hint, err := onlyB(klog.Background(), b, nil, freed)
	require.NoError(t, err)
	assert.Equal(t, fwk.Queue, hint, "an event the lead skips requeues the sibling that wants it")

	require.NoError(t, f.plugin.source.pods.Delete(a))
	assert.True(t, requeues(b), "with the lead gone the sibling is requeued")
}

// requeuedBy reports whether the queue would requeue pod, refused by
// MusterGang, on event (oldObj to newObj): it does when any registered hint
// matching the event answers Queue (none: Queue).
func requeuedBy(t *testing.T, events []fwk.ClusterEventWithHint, event fwk.ClusterEvent, pod *v1.Pod, oldObj, newObj interface{}) bool {
	t.Helper()
	var queued bool
	for _, e := range events {
		if !framework.MatchClusterEvents(e.Event, event) {
			continue
		}
		hint := fwk.Queue
		if e.QueueingHintFn != nil {
			var err error
			hint, err = e.QueueingHintFn(klog.Background(), pod, oldObj, newObj)
			require.NoError(t, err)
		}
		queued = queued || hint == fwk.Queue
	}
	return queued
}
