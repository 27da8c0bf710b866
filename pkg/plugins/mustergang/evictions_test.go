package mustergang

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// TestEvictionRetriesUntilEveryVictimIsGone: a victim's delete fails twice;
// the eviction keeps at it while the plan waits, so the victim gang is
// never left half deleted.
func TestEvictionRetriesUntilEveryVictimIsGone(t *testing.T) {
	low := lowGang("low", "n1", "n2")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, low)
	client := f.plugin.handle.ClientSet().(*fake.Clientset)
	failures := 2
	client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.DeleteAction).GetName() == "low-1" && failures > 0 {
			failures--
			return true, nil, apierrors.NewServiceUnavailable("etcd is busy")
		}
		return false, nil, nil
	})
	key := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
	plan := &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{"j-0": "n1"}}, Reserved: sets.New[types.UID](),
		Victims: sets.New[types.UID]("low-0", "low-1"), Deadline: f.clock.Now().Add(time.Minute)}
	if _, ok := f.plugin.gangs.Install(key, plan, "", "preempting", t0, nil, 0); !ok {
		t.Fatal("Install")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.plugin.evictions.evict(context.Background(), [][]*v1.Pod{low}, worker("j", 0, 8, ""), key, plan.ID)
	}()
	if err := stepClockUntil(f, done); err != nil {
		t.Fatalf("eviction did not finish: %v", err)
	}
	list, _ := client.CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{})
	if len(list.Items) != 0 || failures != 0 {
		t.Errorf("%d pods left, %d failures unused; want every victim deleted after the failures", len(list.Items), failures)
	}
}

// The victims of a preemption are two units, a gang (a0, a1) and a pod
// alone (b0), and the plan waiting for them is dropped while they are
// deleted. A unit already begun is finished, even when its next deletion
// fails once the plan is gone: a gang missing a member is broken and its
// other pods would hold their GPUs for nothing. A unit not begun is left
// whole.
func TestEvictionFinishesTheUnitItBeganAndNoOther(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failA1 fails a1's first deletion, after the plan is dropped.
		failA1 bool
	}{
		{"plan dropped after the gang's last deletion", false},
		{"plan dropped while the gang is half deleted", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := lowGang("a", "n1", "n2")
			b := testobj.MakePod("ns", "b-0").UID("b-0").Node("n1").Priority(1).Obj()
			f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(a, b))
			key := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
			plan := &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{"j-0": "n1"}}, Reserved: sets.New[types.UID](),
				Victims: sets.New[types.UID]("a-0", "a-1", "b-0"), Deadline: f.clock.Now().Add(time.Minute)}
			_, ok := f.plugin.gangs.Install(key, plan, "", "preempting", t0, nil, 0)
			require.True(t, ok)
			client := f.plugin.handle.ClientSet().(*fake.Clientset)
			failed := false
			client.PrependReactor("delete", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
				if action.(k8stesting.DeleteAction).GetName() != "a-1" {
					return false, nil, nil
				}
				f.plugin.drop(context.Background(), key, plan.ID, gang.DropTimeout, "the test drops it")
				if tc.failA1 && !failed {
					failed = true
					return true, nil, apierrors.NewServiceUnavailable("etcd is busy")
				}
				return false, nil, nil
			})
			done := make(chan struct{})
			go func() {
				defer close(done)
				f.plugin.evictions.evict(context.Background(), [][]*v1.Pod{a, {b}}, worker("j", 0, 8, ""), key, plan.ID)
			}()
			require.NoError(t, stepClockUntil(f, done), "the eviction did not finish")
			list, err := client.CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{})
			require.NoError(t, err)
			var left []string
			for _, p := range list.Items {
				left = append(left, p.Name)
			}
			assert.Equal(t, []string{"b-0"}, left, "the gang deleted whole, the pod alone left whole")
			assert.Equal(t, tc.failA1, failed)
		})
	}
}

// An eviction whose deletions keep failing retries while its plan waits,
// and ends when the scheduler stops: it never outlives the scheduler that
// started it (the cycle's context, which ended long before, does not stop
// it).
func TestEvictionEndsWithTheScheduler(t *testing.T) {
	low := lowGang("low", "n1")
	a := worker("j", 0, 8, "")
	a.Spec.Priority = ptr.To[int32](10)
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, append(low, a))
	var deletes atomic.Int32
	f.plugin.handle.ClientSet().(*fake.Clientset).PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		deletes.Add(1)
		return true, nil, apierrors.NewServiceUnavailable("etcd is busy")
	})
	// stepUntil moves the plugin's clock (a retry's backoff runs on it)
	// until done.
	stepUntil := func(done func() bool, msg string) {
		t.Helper()
		require.NoError(t, wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			f.clock.Step(time.Second)
			return done(), nil
		}), msg)
	}
	evictions := schedmetrics.Goroutines.WithLabelValues(EvictionOperation)
	running := func() float64 {
		v, err := testutil.GetGaugeMetricValue(evictions)
		require.NoError(t, err)
		return v
	}
	before := running()
	ctx, cancel := context.WithCancel(context.Background())
	state := framework.NewCycleState()
	f.fw.RunPreFilterPlugins(ctx, state, a)
	f.fw.RunPostFilterPlugins(ctx, state, a, framework.NewDefaultNodeToStatus())
	cancel() // the cycle ends
	key, _ := gang.KeyOf(a)
	plan := f.plugin.gangs.Plan(key)
	require.NotNil(t, plan, "no preemption")
	// The clock steps below must not expire the plan: its deadline would
	// end the eviction too.
	f.plugin.timers.cancel(planDeadline(plan.ID))
	stepUntil(func() bool { return deletes.Load() >= 3 }, "the eviction stopped retrying with the cycle")
	assert.Equal(t, before+1, running(), "the eviction is running")

	f.stop()
	stepUntil(func() bool { return running() == before }, "the eviction outlived the scheduler")
}

// A victim replaced by a pod of its name (a StatefulSet's, between the
// snapshot the search read and the eviction) is done: the new pod is
// neither marked a disruption target nor deleted. The fake client stands
// in for the API server's answers to an apply and a delete that name
// another UID.
func TestEvictionLeavesThePodThatReplacedTheVictim(t *testing.T) {
	victim := worker("low", 0, 8, "n1")
	victim.UID = "old"
	replacement := victim.DeepCopy()
	replacement.UID = "new"
	client := fake.NewClientset(replacement)
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var applied metav1.PartialObjectMetadata
		require.NoError(t, json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &applied))
		if applied.UID != "" && applied.UID != replacement.UID {
			return true, nil, apierrors.NewInvalid(v1.SchemeGroupVersion.WithKind("Pod").GroupKind(), victim.Name,
				field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), applied.UID, "field is immutable")})
		}
		return false, nil, nil
	})
	client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if pre := a.(k8stesting.DeleteAction).GetDeleteOptions().Preconditions; pre != nil && pre.UID != nil && *pre.UID != replacement.UID {
			return true, nil, apierrors.NewConflict(v1.Resource("pods"), victim.Name, fmt.Errorf("precondition failed: UID %s", *pre.UID))
		}
		return false, nil, nil
	})
	markVictim(context.Background(), client, victim, v1.ConditionTrue, preemptionMarker("muster")+"Job ns/high")
	require.NoError(t, deleteVictim(context.Background(), client, victim))

	got, err := client.CoreV1().Pods(victim.Namespace).Get(context.Background(), victim.Name, metav1.GetOptions{})
	require.NoError(t, err, "the replacement was deleted")
	for _, c := range got.Status.Conditions {
		assert.NotEqual(t, v1.DisruptionTarget, c.Type, "the replacement is marked a disruption target")
	}
}

// preemptingGangA: gang a runs on n1 and n2, and Job j's plan waits for
// both of its pods to go, as PostFilter leaves it before the eviction.
func preemptingGangA(t *testing.T) (f *testFramework, a []*v1.Pod, key gang.Key, plan *gang.ActivePlan) {
	t.Helper()
	a = lowGang("a", "n1", "n2")
	f = newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, a)
	key = gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
	plan = &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{"j-0": "n1"}}, Reserved: sets.New[types.UID](),
		Victims: sets.New[types.UID]("a-0", "a-1"), Deadline: f.clock.Now().Add(time.Minute)}
	_, ok := f.plugin.gangs.Install(key, plan, "", "preempting", t0, nil, 0)
	require.True(t, ok)
	return f, a, key, plan
}

// Every pod of a victim unit is marked a disruption target before the
// first is deleted: a scheduler that stops between two deletions leaves
// the rest of the unit marked, for the next one to finish.
func TestEvictionMarksTheWholeUnitBeforeDeletingAny(t *testing.T) {
	f, a, key, plan := preemptingGangA(t)
	var calls []string
	f.plugin.handle.ClientSet().(*fake.Clientset).PrependReactor("*", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if named, ok := action.(interface{ GetName() string }); ok && (action.GetVerb() == "patch" || action.GetVerb() == "delete") {
			calls = append(calls, action.GetVerb()+" "+named.GetName())
		}
		return false, nil, nil
	})
	f.plugin.evictions.evict(context.Background(), [][]*v1.Pod{a}, worker("j", 0, 8, ""), key, plan.ID)
	assert.Equal(t, []string{"patch a-0", "patch a-1", "delete a-0", "delete a-1"}, calls)
}

// A scheduler that starts finishes the preemptions its profile began
// before (the previous leader stopped halfway, evictor.resume): the whole unit of every
// pod still marked by it is deleted, the pods marked by another scheduler
// or whose mark the disruption controller cleared are left, and so are
// unmarked units and members not placed.
func TestStartFinishesThePreemptionsBegunBefore(t *testing.T) {
	markWith := func(p *v1.Pod, message string, status v1.ConditionStatus) *v1.Pod {
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.DisruptionTarget, Status: status,
			Reason: v1.PodReasonPreemptionByScheduler, Message: message})
		return p
	}
	mark := func(p *v1.Pod, by string, status v1.ConditionStatus) *v1.Pod {
		return markWith(p, preemptionMarker(by)+"Job ns/high", status)
	}
	a := lowGang("a", "n1", "n2")
	mark(a[0], "muster", v1.ConditionTrue)
	pendingOfA := worker("a", 2, 8, "")
	g := lowGang("g", "n4", "n3")
	lone := func(name string) *v1.Pod {
		return testobj.MakePod("ns", name).UID(name).Node("n3").Priority(1).Obj()
	}
	pods := append(a, pendingOfA,
		lowGang("c", "n3")[0],
		mark(lone("d"), "default-scheduler", v1.ConditionTrue),
		mark(lone("e"), "muster", v1.ConditionTrue),
		mark(lowGang("f", "n4")[0], "muster", v1.ConditionFalse),
		// upstream's DefaultPreemption, enabled in muster's profile, marked
		// one pod of gang g: not muster's preemption, g is left whole.
		markWith(g[0], "muster: preempting to accommodate a higher priority pod", v1.ConditionTrue), g[1])
	// Started by hand, not by the plugin (it runs once the informers have
	// synced; TestRestartFinishesAHalfDonePreemption starts it so), to see
	// what it leaves once it returns.
	args := defaultArgs(t)
	args.GangPreemption = false
	f := newTestFrameworkWith(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8), gpuNode("n4", 8)}, pods, args)
	<-f.plugin.evictions.resume(context.Background())

	left := func() []string {
		list, err := f.plugin.handle.ClientSet().CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		var names []string
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		return names
	}
	assert.ElementsMatch(t, []string{"a-2", "c-0", "d", "f-0", "g-0", "g-1"}, left())
	var finished []string
	for _, e := range f.takeEvents() {
		if strings.Contains(e, "finishing the preemption") {
			finished = append(finished, e)
		}
	}
	assert.Len(t, finished, 2, "one Event for gang a, one for pod e: %v", finished)
}

// A unit marked for eviction whose first deletion fails after the plan
// waiting for it is gone is left whole, and its marks are set False: no
// scheduler that starts later finishes a preemption that was called off.
func TestEvictionCalledOffUnmarksTheUnit(t *testing.T) {
	f, a, key, plan := preemptingGangA(t)
	client := f.plugin.handle.ClientSet().(*fake.Clientset)
	client.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.plugin.drop(context.Background(), key, plan.ID, gang.DropTimeout, "the test drops it")
		return true, nil, apierrors.NewServiceUnavailable("etcd is busy")
	})
	f.plugin.evictions.evict(context.Background(), [][]*v1.Pod{a}, worker("j", 0, 8, ""), key, plan.ID)

	for _, p := range a {
		got, err := client.CoreV1().Pods("ns").Get(context.Background(), p.Name, metav1.GetOptions{})
		require.NoError(t, err, "%s was deleted", p.Name)
		var status v1.ConditionStatus
		for _, c := range got.Status.Conditions {
			if c.Type == v1.DisruptionTarget {
				status = c.Status
			}
		}
		assert.Equal(t, v1.ConditionFalse, status, "%s's DisruptionTarget condition", p.Name)
		assert.False(t, markedForPreemption(got, preemptionMarker("muster")), "%s is still marked", p.Name)
	}
}

// stepClockUntil steps the plugin's clock, which the retries' backoff runs
// on, until done is closed.
func stepClockUntil(f *testFramework, done <-chan struct{}) error {
	return wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case <-done:
			return true, nil
		default:
			f.clock.Step(time.Second)
			return false, nil
		}
	})
}

// Every caller of resume waits for the deletions the first call started:
// a victim search that called it second used to get a closed channel while
// the resumed unit was still being deleted, and could evict more pods for
// capacity already coming free.
func TestResumeIsFinishedForEveryCallerOnlyWhenItsDeletionsAre(t *testing.T) {
	a := lowGang("a", "n1", "n2")
	for _, p := range a {
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
			Reason: v1.PodReasonPreemptionByScheduler, Message: preemptionMarker("muster") + "Job ns/high"})
	}
	args := defaultArgs(t)
	args.GangPreemption = false // resume is called by hand below
	f := newTestFrameworkWith(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, a, args)
	release := make(chan struct{})
	f.plugin.handle.ClientSet().(*fake.Clientset).PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil
	})
	first := f.plugin.evictions.resume(context.Background())
	second := f.plugin.evictions.resume(context.Background())
	for name, ch := range map[string]<-chan struct{}{"first": first, "second": second} {
		select {
		case <-ch:
			t.Fatalf("the %s caller was told the resumed deletions are done while they are held", name)
		default:
		}
	}
	close(release)
	<-first
	<-second
	list, err := f.plugin.handle.ClientSet().CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items, "the resumed unit deleted whole")
}
