package mustergang

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/tainttoleration"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
	clocktesting "k8s.io/utils/clock/testing"

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
	// stop stops the scheduler: the context its plugins were built with
	// ends.
	stop context.CancelFunc
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
	tfw := &testFramework{queue: queue, clock: clocktesting.NewFakeClock(t0.Add(time.Hour)), stop: cancel,
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
	newTaints := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return tainttoleration.New(ctx, nil, h, feature.Features{})
	}
	plugins = append([]tf.RegisterPluginFunc{
		tf.RegisterPluginAsExtensions(nodeunschedulable.Name, newUnschedulable, "Filter"),
		tf.RegisterPluginAsExtensions(tainttoleration.Name, newTaints, "Filter"),
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
	plan := f.plugin.gangs.Plan(key)
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

func contains(s, part string) bool { return strings.Contains(s, part) }

type binder struct{}

func (binder) Name() string { return "DefaultBinder" }
func (binder) Bind(context.Context, fwk.CycleState, *v1.Pod, string) *fwk.Status {
	return nil
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
