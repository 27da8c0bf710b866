package mustergang

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	kubeschedulerconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/interpodaffinity"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodedeclaredfeatures"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeunschedulable"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/config"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
)

// The plugin's path through the framework (PreFilter → Filter → Reserve →
// Permit → Unreserve, PostFilter), with a framework built from fake
// objects as upstream's plugin tests do: NodeResourcesFit and
// InterPodAffinity beside MusterGang, a fake clientset and informers, a
// snapshot of the nodes and running pods.

// fakeQueue is the nominator and activator the framework needs.
type fakeQueue struct {
	mu        sync.Mutex
	nominated map[string][]fwk.PodInfo
	activated []string
}

func (q *fakeQueue) AddNominatedPod(_ klog.Logger, pi fwk.PodInfo, ni *fwk.NominatingInfo) {
	q.mu.Lock()
	defer q.mu.Unlock()
	node := pi.GetPod().Status.NominatedNodeName
	if ni != nil && ni.Mode() == fwk.ModeOverride {
		node = ni.NominatedNodeName
	}
	q.nominated[node] = append(q.nominated[node], pi)
}

func (q *fakeQueue) DeleteNominatedPodIfExists(pod *v1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for node, pis := range q.nominated {
		var keep []fwk.PodInfo
		for _, pi := range pis {
			if pi.GetPod().UID != pod.UID {
				keep = append(keep, pi)
			}
		}
		q.nominated[node] = keep
	}
}

func (q *fakeQueue) UpdateNominatedPod(logger klog.Logger, old *v1.Pod, pi fwk.PodInfo) {
	q.DeleteNominatedPodIfExists(old)
	q.AddNominatedPod(logger, pi, nil)
}

func (q *fakeQueue) NominatedPodsForNode(node string) []fwk.PodInfo {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]fwk.PodInfo(nil), q.nominated[node]...)
}

func (q *fakeQueue) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for name := range pods {
		q.activated = append(q.activated, name)
	}
}

func defaultArgs(t testing.TB) *config.MusterGangArgs {
	t.Helper()
	external := &configv1.MusterGangArgs{}
	kubeschedulerscheme.Scheme.Default(external)
	internal := &config.MusterGangArgs{}
	if err := kubeschedulerscheme.Scheme.Convert(external, internal, nil); err != nil {
		t.Fatal(err)
	}
	return internal
}

// gpuNode is an idle node of gpus GPUs (and 64 CPUs).
func gpuNode(name string, gpus int64) *v1.Node { return testobj.MakeNode(name).GPUs(gpus).Obj() }

// jobUID is the UID of every test Job; members of Jobs of other names only
// differ by the name in their controller reference.
const jobUID = "job-uid"

// gangJob is Job name of parallelism workers, the owner of worker's pods.
func gangJob(name string, workers int32) *batchv1.Job {
	return testobj.MakeJob("ns", name).UID(jobUID).Workers(workers).Obj()
}

// worker is member index of Job job asking for gpus GPUs, one per node by
// required anti-affinity, bound to node when node is set.
func worker(job string, index int, gpus int64, node string) *v1.Pod {
	name := fmt.Sprintf("%s-%d", job, index)
	return testobj.MakePod("ns", name).UID(name).Label("app", job).Created(t0).OwnedByJob(job, jobUID).
		SchedulerName("muster").Node(node).
		Container(testobj.MakeContainer("w").Request(v1.ResourceCPU, resource.MustParse("1")).GPUs(gpus).Obj()).
		Affinity(testobj.OnePerNode(map[string]string{"app": job})).Obj()
}

type testFramework struct {
	fw     framework.Framework
	plugin *Plugin
	queue  *fakeQueue
	nodes  []fwk.NodeInfo
	clock  *clocktesting.FakeClock
	events *events.FakeRecorder
}

// newTestFramework builds the framework over nodes and pods (bound pods are
// in the snapshot; every pod is in the informer) and a Job of parallelism
// workers.
func newTestFramework(t testing.TB, workers int32, nodes []*v1.Node, pods []*v1.Pod) *testFramework {
	t.Helper()
	return newTestFrameworkWith(t, workers, nodes, pods)
}

// newTestFrameworkWith is newTestFramework with more objects in the fake
// clientset (PodDisruptionBudgets, say).
func newTestFrameworkWith(t testing.TB, workers int32, nodes []*v1.Node, pods []*v1.Pod, extra ...runtime.Object) *testFramework {
	t.Helper()
	schedmetrics.Register()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// The pods' namespace exists, as on a real cluster: InterPodAffinity
	// looks up its labels in every PreFilter.
	// Plugin args among the objects replace the defaults.
	args := defaultArgs(t)
	objects := []runtime.Object{gangJob("j", workers), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}}
	for _, o := range extra {
		if a, ok := o.(*config.MusterGangArgs); ok {
			args = a
			continue
		}
		objects = append(objects, o)
	}
	var bound []*v1.Pod
	for _, p := range pods {
		objects = append(objects, p)
		if p.Spec.NodeName != "" {
			bound = append(bound, p)
		}
	}
	for _, n := range nodes {
		objects = append(objects, n)
	}
	client := fake.NewClientset(objects...)
	factory := informers.NewSharedInformerFactory(client, 0)
	snapshot := schedcache.NewSnapshot(bound, nodes)
	queue := &fakeQueue{nominated: map[string][]fwk.PodInfo{}}
	tfw := &testFramework{queue: queue, clock: clocktesting.NewFakeClock(t0.Add(time.Hour)),
		events: &events.FakeRecorder{Events: make(chan string, 1000), Verbose: true}}
	newMuster := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		pl, err := Factory(tfw.clock)(ctx, args, h)
		if err == nil {
			tfw.plugin = pl.(*Plugin)
		}
		return pl, err
	}
	// A DeviceClass among the objects brings in dynamic resource
	// allocation: the framework's DRA manager and the DynamicResources
	// plugin, as kube-scheduler wires them, with the features of the
	// default gates (NodeResourcesFit then leaves DRA-served extended
	// resources to DynamicResources).
	var fts feature.Features
	var plugins []tf.RegisterPluginFunc
	var opts []frameworkruntime.Option
	for _, o := range extra {
		if _, ok := o.(*resourceapi.DeviceClass); ok && opts == nil {
			fts = feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
			manager, err := newDRAManager(ctx, client, factory)
			if err != nil {
				t.Fatal(err)
			}
			opts = append(opts, frameworkruntime.WithSharedDRAManager(manager))
			newDRA := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
				return dynamicresources.New(ctx, &kubeschedulerconfig.DynamicResourcesArgs{FilterTimeout: &metav1.Duration{}}, h, fts)
			}
			// NodeDeclaredFeatures filters after DynamicResources, as in
			// the default profile of 1.37.
			newDeclared := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
				return nodedeclaredfeatures.New(ctx, nil, h, fts)
			}
			plugins = append(plugins, tf.RegisterPluginAsExtensions(dynamicresources.Name, newDRA, "PreFilter", "Filter", "Reserve", "PreBind"),
				tf.RegisterPluginAsExtensions(nodedeclaredfeatures.Name, newDeclared, "PreFilter", "Filter"))
		}
	}
	newFit := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return noderesources.NewFit(ctx, &kubeschedulerconfig.NodeResourcesFitArgs{
			ScoringStrategy: &kubeschedulerconfig.ScoringStrategy{Type: kubeschedulerconfig.LeastAllocated,
				Resources: []kubeschedulerconfig.ResourceSpec{{Name: "cpu", Weight: 1}}},
		}, h, fts)
	}
	newAffinity := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return interpodaffinity.New(ctx, &kubeschedulerconfig.InterPodAffinityArgs{}, h, feature.Features{})
	}
	newUnschedulable := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return nodeunschedulable.New(ctx, nil, h, feature.Features{})
	}
	plugins = append([]tf.RegisterPluginFunc{
		tf.RegisterPluginAsExtensions(nodeunschedulable.Name, newUnschedulable, "Filter"),
		tf.RegisterPluginAsExtensions(noderesources.Name, newFit, "PreFilter", "Filter"),
		tf.RegisterPluginAsExtensions(interpodaffinity.Name, newAffinity, "PreFilter", "Filter"),
	}, plugins...)
	plugins = append(plugins,
		tf.RegisterPluginAsExtensions(Name, newMuster, "QueueSort", "PreFilter", "Filter", "PostFilter", "Reserve", "Permit"),
		tf.RegisterBindPlugin("DefaultBinder", func(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error) { return binder{}, nil }))
	fw, err := tf.NewFramework(ctx, plugins, "muster", append(opts,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithPodNominator(queue),
		frameworkruntime.WithPodActivator(queue),
		frameworkruntime.WithWaitingPods(frameworkruntime.NewWaitingPodsMap()),
		frameworkruntime.WithEventRecorder(tfw.events),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	if len(opts) > 0 {
		waitForDRA(t, fw.SharedDRAManager(), extra)
	}
	tfw.fw = fw
	tfw.nodes, _ = snapshot.NodeInfos().List()
	return tfw
}

// takeEvents returns the Events recorded since the last call, each as
// "type reason action message {kind=…,apiVersion=…}".
func (f *testFramework) takeEvents() []string {
	got := make([]string, len(f.events.Events))
	for i := range got {
		got[i] = <-f.events.Events
	}
	return got
}

func (f *testFramework) preFilter(t testing.TB, pod *v1.Pod) (fwk.CycleState, *fwk.Status) {
	t.Helper()
	state := framework.NewCycleState()
	_, status, _ := f.fw.RunPreFilterPlugins(context.Background(), state, pod)
	return state, status
}

// planAndWait plans the gang through a's cycle and takes a to Permit, where
// it waits for its siblings (registered as the scheduler does).
func (f *testFramework) planAndWait(t *testing.T, a *v1.Pod) (fwk.CycleState, *gang.ActivePlan) {
	t.Helper()
	state, status := f.preFilter(t, a)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	key, _ := gang.KeyOf(a)
	plan := f.plugin.registry.Plan(key)
	slot := plan.Slots[a.UID]
	if st := f.fw.RunReservePluginsReserve(context.Background(), state, a, slot); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	waits, st := f.fw.RunPermitPlugins(context.Background(), state, a, slot)
	if st.Code() != fwk.Wait {
		t.Fatalf("Permit: %v, want Wait", st)
	}
	f.fw.AddWaitingPod(a, waits)
	return state, plan
}

func TestPlanUsesFrameworkFiltersAroundRunningSibling(t *testing.T) {
	// j-0 runs on n1; its replacement j-2 (for a failed j-1) is pending. The
	// planner's best fit is n1 (4 GPUs free, the least room that fits), but
	// InterPodAffinity rejects a second worker there: the plan says n2.
	running := worker("j", 0, 4, "n1")
	replacement := worker("j", 2, 4, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{running, replacement})

	state, status := f.preFilter(t, replacement)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	key, _ := gang.KeyOf(replacement)
	plan := f.plugin.registry.Plan(key)
	if plan == nil || plan.Slots[replacement.UID] != "n2" {
		t.Fatalf("plan %+v, want the replacement on n2", plan)
	}
	if plan.Bound != 1 {
		t.Errorf("plan counted %d running members, want 1", plan.Bound)
	}
	// Filter keeps it there.
	for _, ni := range f.nodes {
		st := f.fw.RunFilterPlugins(context.Background(), state, replacement, ni)
		if got, want := st.IsSuccess(), ni.Node().Name == "n2"; got != want {
			t.Errorf("Filter on %s: %v", ni.Node().Name, st)
		}
	}
	// Reserve and Permit complete the one-member plan at once.
	if st := f.fw.RunReservePluginsReserve(context.Background(), state, replacement, "n2"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	if _, st := f.fw.RunPermitPlugins(context.Background(), state, replacement, "n2"); !st.IsSuccess() {
		t.Fatalf("Permit: %v", st)
	}
	if f.plugin.registry.Plan(key) != nil {
		t.Error("the completed plan still holds capacity")
	}
}

func TestNoPlanWhenFiltersRejectEveryNode(t *testing.T) {
	// Both nodes run a worker of the job; the replacement fits by GPUs on
	// either, but anti-affinity rejects both: no plan, nothing held, and the
	// message carries the framework's reason.
	pods := []*v1.Pod{worker("j", 0, 4, "n1"), worker("j", 1, 4, "n2"), worker("j", 3, 4, "")}
	f := newTestFramework(t, 3, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, pods)
	_, status := f.preFilter(t, pods[2])
	if status.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter: %v, want UnschedulableAndUnresolvable", status)
	}
	for _, want := range []string{"gang ns/j", "filters rejected", "anti-affinity"} {
		if !contains(status.Message(), want) {
			t.Errorf("message %q does not contain %q", status.Message(), want)
		}
	}
	key, _ := gang.KeyOf(pods[2])
	if f.plugin.registry.Plan(key) != nil || len(f.plugin.registry.Held(gang.Key{})) != 0 {
		t.Error("a gang without a plan holds capacity")
	}
}

func TestRejectedMemberDropsPlanAndNextPlanAvoidsThePair(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	state, plan := f.planAndWait(t, a)
	slotA := plan.Slots[a.UID]
	if len(f.queue.activated) == 0 {
		t.Error("planning did not wake the sibling")
	}

	// b's planned node is rejected by another plugin in b's own cycle
	// (something changed since the plan): PostFilter drops the plan at once.
	bState, status := f.preFilter(t, b)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of b: %v", status)
	}
	slotB := plan.Slots[b.UID]
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set(slotB, fwk.NewStatus(fwk.Unschedulable, "node(s) had volume node affinity conflict"))
	result, st := f.fw.RunPostFilterPlugins(context.Background(), bState, b, statuses)
	if st.IsSuccess() || result == nil || result.NominatingInfo == nil || result.NominatedNodeName != "" {
		t.Errorf("PostFilter = %+v, %v; want Unschedulable clearing the nomination", result, st)
	}
	if f.plugin.registry.Plan(key) != nil {
		t.Fatal("the broken plan was not dropped")
	}
	// Unreserve of the waiting member (rejected by the drop) is idempotent.
	f.fw.RunReservePluginsUnreserve(context.Background(), state, a, slotA)

	// After the backoff, the next plan keeps b off the node it failed on.
	f.clock.Step(time.Minute - time.Second)
	if _, status := f.preFilter(t, a); !status.IsSuccess() {
		t.Fatalf("PreFilter after backoff: %v", status)
	}
	next := f.plugin.registry.Plan(key)
	if next == nil || next.Slots[b.UID] == slotB {
		t.Errorf("next plan %+v puts %s on %s again", next, b.Name, slotB)
	}
}

func TestUnreserveOfWaitingMemberReleasesPlan(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	state, status := f.preFilter(t, a)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	slot := f.plugin.registry.Plan(key).Slots[a.UID]
	if held := f.plugin.registry.Held(gang.Key{}); len(held) != 2 {
		t.Errorf("the plan holds %v, want both nodes", held)
	}
	f.fw.RunReservePluginsReserve(context.Background(), state, a, slot)
	// Another plugin's Reserve fails after ours: the framework unreserves.
	f.fw.RunReservePluginsUnreserve(context.Background(), state, a, slot)
	if f.plugin.registry.Plan(key) != nil || len(f.plugin.registry.Held(gang.Key{})) != 0 {
		t.Error("Unreserve left the plan holding capacity")
	}
	if until, _ := f.plugin.registry.Backoff(key); !until.After(f.clock.Now()) {
		t.Error("the gang does not back off")
	}
	// muster did not reject a: its own cycle failed on the node, so the
	// next plan does not put it there again.
	if !f.plugin.registry.Avoided(key, f.clock.Now())[a.UID][slot] {
		t.Errorf("the failed pair (%s, %s) is not avoided", a.Name, slot)
	}
}

func TestDryRunSkipsMusterGang(t *testing.T) {
	p := &Plugin{}
	state := framework.NewCycleState()
	state.Write(dryRunKey, dryRunMarker{})
	if _, st := p.PreFilter(context.Background(), state, worker("j", 0, 1, ""), nil); !st.IsSkip() {
		t.Errorf("PreFilter in a dry run = %v, want Skip", st)
	}
}

func contains(s, part string) bool { return strings.Contains(s, part) }

type binder struct{}

func (binder) Name() string { return "DefaultBinder" }
func (binder) Bind(context.Context, fwk.CycleState, *v1.Pod, string) *fwk.Status {
	return nil
}

func TestPlanDeadlineReleasesWaitingMembers(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	_, plan := f.planAndWait(t, a)
	before, err := testutil.GetCounterMetricValue(timeouts)
	if err != nil {
		t.Fatal(err)
	}
	// b never reaches Permit before the gang's deadline.
	f.plugin.expirePlan(key, plan.ID)
	st := f.fw.WaitOnPermit(context.Background(), a)
	if st.IsSuccess() || !contains(st.Message(), "timed out") {
		t.Errorf("waiting member ended with %v, want a rejection saying the gang timed out", st)
	}
	if f.plugin.registry.Plan(key) != nil || len(f.plugin.registry.Held(gang.Key{})) != 0 {
		t.Error("the expired plan still holds capacity")
	}
	if after, _ := testutil.GetCounterMetricValue(timeouts); after != before+1 {
		t.Errorf("muster_gang_timeouts_total went from %v to %v, want +1", before, after)
	}
}

func TestPreemptionPlansWithVictimsGoneAndWaitsForThem(t *testing.T) {
	low0, low1 := worker("low", 0, 8, "n1"), worker("low", 1, 8, "n2")
	high := worker("j", 0, 8, "")
	for _, p := range []*v1.Pod{low0, low1} {
		p.Spec.Priority = ptr.To[int32](1)
		p.OwnerReferences[0].Name = "low"
	}
	high.Spec.Priority = ptr.To[int32](100)
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{low0, low1, high})
	f.keepPodsInAPI()
	key, _ := gang.KeyOf(high)

	state, status := f.preFilter(t, high)
	if status.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter on a full cluster: %v", status)
	}
	result, status := f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	plan := f.plugin.registry.Plan(key)
	if plan == nil || plan.Victims.Len() != 2 {
		t.Fatalf("plan %+v after PostFilter (%v), want one waiting for the whole low gang (2 pods)", plan, status)
	}
	if result == nil || result.NominatedNodeName != plan.Slots[high.UID] {
		t.Errorf("PostFilter result %+v, want the preemptor nominated to its slot %s", result, plan.Slots[high.UID])
	}
	// The slot is held: a pod scheduled alone may not take it.
	if held := f.plugin.registry.Held(gang.Key{}); len(held) != 1 {
		t.Errorf("held %v, want the preemptor's slot", held)
	}
	// Until the victims are gone, the member waits.
	heldState, status := f.preFilter(t, high)
	if status.IsSuccess() || !contains(status.Message(), "2 of them still terminating") {
		t.Errorf("PreFilter while victims terminate: %v", status)
	}
	f.plugin.onPodDelete(low0)
	f.plugin.onPodDelete(low1)
	if plan := f.plugin.registry.Plan(key); plan == nil || plan.Victims.Len() != 0 {
		t.Fatalf("plan %+v after the victims went", plan)
	}
	if !slicesContain(f.queue.activated, "ns/j-0") {
		t.Errorf("the preemptor was not woken when its victims were gone (activated %v)", f.queue.activated)
	}

	// The plugin's informer can see the victims go before the scheduler's
	// cache does. A member that muster's PreFilter held back just before the
	// last victim went, or that meets a victim still in its cycle's
	// snapshot (here: the snapshot still has both), keeps the plan.
	slot := plan.Slots[high.UID]
	heldBack := framework.NewDefaultNodeToStatus()
	heldBack.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "gang ns/j preempted pods to make room and waits for them; 1 of them still terminating").WithPlugin(Name))
	if result, _ := f.fw.RunPostFilterPlugins(context.Background(), heldState, high, heldBack); f.plugin.registry.Plan(key) == nil ||
		result == nil || result.NominatedNodeName != slot {
		t.Errorf("PostFilter after muster's own wait dropped the plan or the nomination (result %+v)", result)
	}
	// The snapshot still shows the victims: every member waits for the
	// cache (a member steered now would be refused there and break the
	// plan), and the PostFilter wakes the gang again after the cache lag.
	cachedState, status := f.preFilter(t, high)
	if status.IsSuccess() || !contains(status.Message(), "waits for them to leave") {
		t.Fatalf("PreFilter while the snapshot still shows the victims: %v", status)
	}
	f.takeActivated()
	if result, _ := f.fw.RunPostFilterPlugins(context.Background(), cachedState, high, framework.NewDefaultNodeToStatus()); f.plugin.registry.Plan(key) == nil ||
		result == nil || result.NominatedNodeName != slot {
		t.Errorf("PostFilter while the cache lags dropped the plan or the nomination (result %+v)", result)
	}
	if woken := f.takeActivated(); len(woken) != 0 {
		t.Errorf("woken before the cache lag passed: %v", woken)
	}
	f.clock.Step(cacheLag)
	if woken := f.takeActivated(); !slicesContain(woken, "ns/j-0") {
		t.Errorf("not woken after the cache lag (activated %v)", woken)
	}

	// Once the cache has dropped them, the member goes to its slot.
	for _, victim := range []*v1.Pod{low0, low1} {
		ni, err := f.fw.SnapshotSharedLister().NodeInfos().Get(victim.Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		if err := ni.RemovePod(klog.Background(), victim); err != nil {
			t.Fatal(err)
		}
	}
	steered, status := f.preFilter(t, high)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter once the victims are gone: %v", status)
	}
	stale := framework.NewDefaultNodeToStatus()
	stale.Set(slot, fwk.NewStatus(fwk.Unschedulable, "Insufficient nvidia.com/gpu").WithPlugin("NodeResourcesFit"))
	if result, _ := f.fw.RunPostFilterPlugins(context.Background(), steered, high, stale); f.plugin.registry.Plan(key) != nil || result == nil || result.NominatedNodeName != "" {
		t.Errorf("a real refusal at the slot once the victims are gone kept the plan (result %+v)", result)
	}
}

func TestNoPreemptionOfEqualPriorityOrWhenNever(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*v1.Pod)
	}{
		{"equal priority", func(p *v1.Pod) { p.Spec.Priority = ptr.To[int32](1) }},
		{"preemptionPolicy Never", func(p *v1.Pod) {
			p.Spec.Priority = ptr.To[int32](100)
			p.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			low := worker("low", 0, 8, "n1")
			low.Spec.Priority = ptr.To[int32](1)
			low.OwnerReferences[0].Name = "low"
			pod := worker("j", 0, 8, "")
			tc.mutate(pod)
			f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{low, pod})
			state, _ := f.preFilter(t, pod)
			f.fw.RunPostFilterPlugins(context.Background(), state, pod, framework.NewDefaultNodeToStatus())
			key, _ := gang.KeyOf(pod)
			if f.plugin.registry.Plan(key) != nil {
				t.Error("preempted")
			}
		})
	}
}

// TestCordonIsDecidedOnce: a cordoned node is the framework's
// NodeUnschedulable filter's to refuse (muster's Filter, with the default
// reclaim taints, does not re-check it), the planner leaves it out, and so
// preemption finds nothing to evict for: the one lower-priority pod runs
// only there.
func TestCordonIsDecidedOnce(t *testing.T) {
	cordoned := gpuNode("n1", 8)
	cordoned.Spec.Unschedulable = true // and the taint the node controller adds with it
	cordoned.Spec.Taints = append(cordoned.Spec.Taints, v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule})
	low := worker("low", 0, 8, "n1")
	low.Spec.Priority = ptr.To[int32](1)
	low.OwnerReferences[0].Name = "low"
	high := worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	lone := worker("lone", 0, 0, "")
	lone.OwnerReferences = nil
	f := newTestFramework(t, 1, []*v1.Node{cordoned}, []*v1.Pod{low, high, lone})

	state, status := f.preFilter(t, lone)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of a pod scheduled alone: %v", status)
	}
	ni, err := f.fw.SnapshotSharedLister().NodeInfos().Get("n1")
	if err != nil {
		t.Fatal(err)
	}
	if status := f.fw.RunFilterPlugins(context.Background(), state, lone, ni); status.IsSuccess() || status.Plugin() != nodeunschedulable.Name {
		t.Errorf("Filter on the cordoned node: %v (plugin %q), want NodeUnschedulable's refusal", status, status.Plugin())
	}
	if status := f.plugin.Filter(context.Background(), state, lone, ni); !status.IsSuccess() {
		t.Errorf("muster's Filter re-checks the cordon: %v", status)
	}

	state, status = f.preFilter(t, high)
	if status.IsSuccess() || !contains(status.Message(), "cordoned") {
		t.Fatalf("PreFilter with the only node cordoned: %v, want the planner to leave it out", status)
	}
	f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	key, _ := gang.KeyOf(high)
	if plan := f.plugin.registry.Plan(key); plan != nil {
		t.Errorf("plan %+v: preempted on a cordoned node", plan)
	}
}

// keepPodsInAPI refuses every pod deletion in the fake API, so the
// victims of a preemption stay until the test itself tells the plugin they
// went (onPodDelete); otherwise the informer's delete event races with the
// test's checks of the waiting plan.
func (f *testFramework) keepPodsInAPI() {
	f.plugin.handle.ClientSet().(*fake.Clientset).PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("kept by the test")
	})
}

func slicesContain(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A member whose PreFilter state is missing (a bug) is never let through as
// if it were scheduled alone.
func TestMissingStateIsAnErrorNotALonePod(t *testing.T) {
	p := &Plugin{registry: gang.NewRegistry()}
	state := framework.NewCycleState()
	pod := worker("j", 0, 8, "")
	if st, _ := p.Permit(context.Background(), state, pod, "n1"); st.Code() != fwk.Error {
		t.Errorf("Permit without state = %v, want Error", st)
	}
	if st := p.Reserve(context.Background(), state, pod, "n1"); st.Code() != fwk.Error {
		t.Errorf("Reserve without state = %v, want Error", st)
	}
}

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

// TestNodeViewsFollowNodeInfoChanges: a node's view is reused while its
// NodeInfo is unchanged and recomputed when a pod lands on it; the snapshot
// generation is the highest NodeInfo's; capacity held for other gangs is
// subtracted from the right node without touching the kept views, and
// each subtraction starts from the views, not from the last one.
func TestNodeViewsFollowNodeInfoChanges(t *testing.T) {
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil)
	n1, n2 := framework.NewNodeInfo(), framework.NewNodeInfo()
	n1.SetNode(gpuNode("n1", 8))
	n2.SetNode(gpuNode("n2", 8))
	nodes := []fwk.NodeInfo{n1, n2}
	gpus := func(views []gang.NodeView) []int64 {
		var out []int64
		for _, v := range views {
			out = append(out, v.Free.Scalars[configv1.DefaultGPUResourceName])
		}
		return out
	}

	views, generation := f.plugin.nodeViews(nodes, nil)
	assert.Equal(t, []int64{8, 8}, gpus(views))
	assert.Equal(t, max(n1.GetGeneration(), n2.GetGeneration()), generation)

	held := map[string]gang.Resources{"n2": {Scalars: map[v1.ResourceName]int64{configv1.DefaultGPUResourceName: 3}}}
	assert.Equal(t, []int64{8, 5}, gpus(f.plugin.subtractHeld(views, held)), "held capacity subtracted from its node")
	views, _ = f.plugin.nodeViews(nodes, nil)
	assert.Equal(t, []int64{8, 8}, gpus(views), "the kept views were not changed by the subtraction")
	other := map[string]gang.Resources{"n1": {Scalars: map[v1.ResourceName]int64{configv1.DefaultGPUResourceName: 2}}}
	assert.Equal(t, []int64{6, 8}, gpus(f.plugin.subtractHeld(views, other)), "the last subtraction is undone before the next")

	n2.AddPod(worker("other", 0, 2, "n2"))
	views, generation = f.plugin.nodeViews(nodes, nil)
	assert.Equal(t, []int64{8, 6}, gpus(views), "a pod added to the node is seen")
	assert.Equal(t, n2.GetGeneration(), generation, "the changed node raises the generation")

	// The list reordered (a node left and came back): positions follow.
	views, _ = f.plugin.nodeViews([]fwk.NodeInfo{n2, n1}, nil)
	assert.Equal(t, []int64{3, 8}, gpus(f.plugin.subtractHeld(views, held)), "held found at the node's new position")
}

// TestMembersThatDisagreeArePlannedNever: members of one gang asking for
// different placement (a TFJob's templates each carry annotations) are
// reported GangInvalid and hold nothing, whichever member comes first.
func TestMembersThatDisagreeArePlannedNever(t *testing.T) {
	a, b := worker("j", 0, 1, ""), worker("j", 1, 1, "")
	b.Annotations = map[string]string{gang.AnnotationPreemptible: "forbid"}
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	for _, first := range []*v1.Pod{a, b} {
		_, status := f.preFilter(t, first)
		assert.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code(), "member %s", first.Name)
		assert.Contains(t, status.Message(), "ask for different placement")
		assert.Nil(t, f.plugin.registry.Plan(key))
		assert.Empty(t, f.plugin.registry.Held(gang.Key{}))
		outcome, _ := f.plugin.registry.LastNotice(key)
		assert.Equal(t, gang.OutcomeInvalid, outcome)
	}
}

func TestMemberWithUnparsableAffinityMakesTheGangInvalid(t *testing.T) {
	// j-1's anti-affinity selector cannot be parsed, so the framework can
	// never place it. j-0's cycle plans the gang: it is reported invalid,
	// naming j-1, and holds nothing.
	a, b := worker("j", 0, 1, ""), worker("j", 1, 1, "")
	b.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector = &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}},
	}
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	_, status := f.preFilter(t, a)
	assert.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code())
	assert.Contains(t, status.Message(), "member j-1")
	assert.Nil(t, f.plugin.registry.Plan(key))
	assert.Empty(t, f.plugin.registry.Held(gang.Key{}))
	outcome, _ := f.plugin.registry.LastNotice(key)
	assert.Equal(t, gang.OutcomeInvalid, outcome)
}

func TestLonePodStaysOffHeldCapacity(t *testing.T) {
	// A gang's plan holds its members' slots while they come to Permit; a
	// pod scheduled alone asking for one GPU is kept off every node whose
	// free GPUs the plan holds, and only those.
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	lone := testobj.MakePod("ns", "lone").UID("lone").SchedulerName("muster").
		Container(testobj.MakeContainer("c").GPUs(1).Obj()).Obj()
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, []*v1.Pod{a, b, lone})
	f.planAndWait(t, a)
	held := f.plugin.registry.Held(gang.Key{})
	if len(held) == 0 {
		t.Fatal("the gang's plan holds no capacity")
	}
	state, status := f.preFilter(t, lone)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of the lone pod: %v", status)
	}
	for _, ni := range f.nodes {
		st := f.plugin.Filter(context.Background(), state, lone, ni)
		if name := ni.Node().Name; held[name].Scalars["nvidia.com/gpu"] > 0 {
			assert.Equal(t, fwk.Unschedulable, st.Code(), "node %s, held for the gang", name)
			assert.Contains(t, st.Message(), "capacity held")
		} else {
			assert.True(t, st.IsSuccess(), "node %s: %v", name, st)
		}
	}
}

func TestMemberPlacedInTwoTrialsKeepsEachPlacement(t *testing.T) {
	// A plan that tries a second domain places a member again: each trial's
	// copy of the member names its own node and counts against that node
	// only, and neither the member nor the snapshot's NodeInfo changes.
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	a.Spec.Affinity, b.Spec.Affinity = nil, nil // resources alone decide
	n1, n2 := gpuNode("n1", 8), gpuNode("n2", 8)
	f := newTestFramework(t, 2, []*v1.Node{n1, n2}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	check, err := f.plugin.newFilterCheck(context.Background(), key, podInfos(t, a, b), nil)
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := &gang.Member{UID: a.UID, Name: a.Name}, &gang.Member{UID: b.UID, Name: b.Name}

	first := check.Trial().(*filterTrial)
	if !first.Fits(ma, n1) {
		t.Fatal("a does not fit on the empty n1")
	}
	first.Place(ma, n1)
	if first.Fits(mb, n1) {
		t.Error("first trial: b fits on n1 beside a (a's GPUs not counted there)")
	}
	if !first.Fits(mb, n2) {
		t.Error("first trial: b does not fit on the empty n2")
	}

	second := check.Trial().(*filterTrial)
	second.Place(ma, n2)
	if !second.Fits(mb, n1) {
		t.Error("second trial: b does not fit on n1, which only the first trial used")
	}
	if second.Fits(mb, n2) {
		t.Error("second trial: b fits on n2 beside a")
	}

	if got := first.placed[0].info.GetPod().Spec.NodeName; got != "n1" {
		t.Errorf("first trial's a is on %q, want n1", got)
	}
	if got := second.placed[0].info.GetPod().Spec.NodeName; got != "n2" {
		t.Errorf("second trial's a is on %q, want n2", got)
	}
	if a.Spec.NodeName != "" {
		t.Errorf("placing changed the member itself: on %q", a.Spec.NodeName)
	}
	for _, name := range []string{"n1", "n2"} {
		ni, err := check.nodes.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(ni.GetPods()); n != 0 {
			t.Errorf("the snapshot's %s has %d pods after the trials, want 0", name, n)
		}
	}
}

func TestMemberRequestIsWhatTheNodeCounts(t *testing.T) {
	// A plan subtracts each member's request from the node's free
	// resources; the framework adds the pod's CalculateResource to the
	// node's requested ones. They must be the same amount, including for a
	// running pod whose resize is still in progress (the larger of spec and
	// status counts), as preemption frees.
	resizing := worker("j", 1, 2, "n1")
	resizing.Status.ContainerStatuses = []v1.ContainerStatus{{
		Name:               "w",
		AllocatedResources: v1.ResourceList{v1.ResourceCPU: resource.MustParse("3")},
		Resources: &v1.ResourceRequirements{Requests: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("3"),
		}},
	}}
	withInit := worker("j", 2, 1, "")
	withInit.Spec.InitContainers = []v1.Container{testobj.MakeContainer("init").Request(v1.ResourceCPU, resource.MustParse("4")).Obj()}
	withInit.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}

	for name, pod := range map[string]*v1.Pod{"worker": worker("j", 0, 8, ""), "resizing": resizing, "init and overhead": withInit} {
		t.Run(name, func(t *testing.T) {
			ni := framework.NewNodeInfo()
			ni.SetNode(gpuNode("n1", 8))
			before := gang.FreeOnNode(ni)
			ni.AddPod(pod)
			counted := before
			counted.Sub(gang.FreeOnNode(ni))
			assert.Equal(t, counted, (&Plugin{}).requestOf(pod))
		})
	}
}

func podInfos(t testing.TB, pods ...*v1.Pod) []*framework.PodInfo {
	t.Helper()
	infos := make([]*framework.PodInfo, len(pods))
	for i, pod := range pods {
		var err error
		if infos[i], err = framework.NewPodInfo(pod); err != nil {
			t.Fatal(err)
		}
	}
	return infos
}
