package mustergang

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	autoscalingv1 "k8s.io/autoscaler/cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/config"
	"github.com/muster-sched/muster/pkg/gang"
)

// muster writes cluster-autoscaler's names as its API module spells them.
func TestProvisioningNamesAreTheAutoscalers(t *testing.T) {
	assert.Equal(t, autoscalingv1.ProvisioningRequestPodAnnotationKey, ConsumeProvisioningRequestAnnotation)
	assert.Equal(t, autoscalingv1.ProvisioningClassPodAnnotationKey, ProvisioningClassAnnotation)
	assert.Equal(t, autoscalingv1.SchemeGroupVersion.String(), ProvisioningRequests.GroupVersion().String())
	for _, c := range []string{autoscalingv1.Accepted, autoscalingv1.Provisioned, autoscalingv1.Failed, autoscalingv1.BookingExpired, autoscalingv1.CapacityRevoked} {
		assert.Contains(t, []string{provisioningAccepted, provisioningProvisioned, provisioningFailed, provisioningBookingExpired, provisioningCapacityRevoked}, c)
	}
}

// Members alike make one pod set; a PS without GPU another; a member whose
// node selector differs a third.
func TestPodSetsGroupMembersAlike(t *testing.T) {
	worker := func(name string) *v1.Pod {
		return testobj.MakePod("ns", name).PodSpec(testobj.WorkerPodSpec("muster", 8)).Obj()
	}
	ps := testobj.MakePod("ns", "ps").PodSpec(testobj.WorkerPodSpec("muster", 0)).Obj()
	other := worker("w9")
	other.Spec.NodeSelector = map[string]string{"pool": "a100"}
	sets := podSets([]*v1.Pod{worker("w0"), ps, worker("w1"), other, worker("w2")})
	require.Len(t, sets, 3)
	assert.Equal(t, []int{3, 1, 1}, []int{sets[0].count, sets[1].count, sets[2].count})
	assert.Equal(t, "ps", sets[1].pod.Name)
}

// forbid keeps the autoscaler off every spot label, in every term of the
// member's own affinity; require puts it on any one of them.
func TestPolicyAffinity(t *testing.T) {
	matchers := []config.NodeMatcher{{Source: config.NodeMatcherLabel, Key: "cloud.google.com/gke-spot", Value: "true"},
		{Source: config.NodeMatcherLabel, Key: "karpenter.sh/capacity-type", Value: "spot"},
		{Source: config.NodeMatcherTaint, Key: "spot"}}
	own := v1.NodeSelectorRequirement{Key: "pool", Operator: v1.NodeSelectorOpIn, Values: []string{"gpu"}}
	spec := func() *v1.PodSpec {
		return &v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{own}}}}}}}
	}
	terms := func(s *v1.PodSpec) []v1.NodeSelectorTerm {
		return s.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}

	forbid := spec()
	policyAffinity(forbid, gang.PolicyForbid, matchers)
	require.Len(t, terms(forbid), 1)
	assert.Equal(t, []v1.NodeSelectorRequirement{own,
		{Key: "cloud.google.com/gke-spot", Operator: v1.NodeSelectorOpNotIn, Values: []string{"true"}},
		{Key: "karpenter.sh/capacity-type", Operator: v1.NodeSelectorOpNotIn, Values: []string{"spot"}}}, terms(forbid)[0].MatchExpressions)

	require := spec()
	policyAffinity(require, gang.PolicyRequire, matchers)
	assert.Len(t, terms(require), 2, "one term per spot label, each with the member's own requirement")
	for _, term := range terms(require) {
		assert.Equal(t, own, term.MatchExpressions[0])
		assert.Equal(t, v1.NodeSelectorOpIn, term.MatchExpressions[1].Operator)
	}

	avoid := &v1.PodSpec{}
	policyAffinity(avoid, gang.PolicyAvoid, matchers)
	assert.Nil(t, avoid.Affinity, "avoid and prefer leave the autoscaler free")
}

// A request's name is the gang's for the life of any scheduler, a valid
// name however long the gang's, and different for different gangs.
func TestRequestName(t *testing.T) {
	a := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "mnist"}
	assert.Equal(t, requestName(a), requestName(a))
	assert.NotEqual(t, requestName(a), requestName(gang.Key{Kind: gang.KindPodGroup, Namespace: "ns", Name: "mnist"}))
	long := requestName(gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: strings.Repeat("x", 253)})
	assert.LessOrEqual(t, len(long), 253)

	u := &unstructured.Unstructured{}
	u.SetNamespace("ns")
	u.SetLabels(map[string]string{ManagedByLabel: managedBy})
	u.SetAnnotations(map[string]string{gangKindAnnotation: string(a.Kind), gangNameAnnotation: a.Name})
	got, ok := requestGang(u)
	assert.True(t, ok)
	assert.Equal(t, a, got)
	u.SetLabels(nil)
	_, ok = requestGang(u)
	assert.False(t, ok, "a request muster did not make is not muster's")
}

// The provisioner keeps a gang from the moment it needs nodes until it
// leaves; a gang that never needed any is never kept. (A scheduler runs
// for months.)
func TestProvisionerForgetsGangsThatLeft(t *testing.T) {
	pv := &provisioner{gangs: map[gang.Key]*gangProvisioning{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[gang.Key]())}
	defer pv.queue.ShutDown()
	a := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "a"}
	b := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "b"}
	pv.noticed(gang.Notice{Key: a, Outcome: gang.OutcomeUnschedulable})
	pv.noticed(gang.Notice{Key: b, Outcome: gang.OutcomeScheduled})
	pv.noticed(gang.Notice{Key: gang.Key{Kind: gang.KindPod, Namespace: "ns", Name: "alone"}, Outcome: gang.OutcomeUnschedulable})
	sizes := map[string]int{}
	pv.sizes(sizes)
	assert.Equal(t, 1, sizes["provisioning gangs"], "only the gang that needs nodes is kept")
	assert.Equal(t, needNodes, pv.gangs[a].need)

	pv.noticed(gang.Notice{Key: a, Outcome: gang.OutcomePlanned})
	assert.Equal(t, needNone, pv.gangs[a].need, "a gang with a plan needs no nodes")
	assert.Equal(t, 1, pv.queue.Len(), "a queued to delete any request it has; b, never kept, is not (a request an earlier scheduler left is found by its informer event)")

	// a's pods are gone and it has no request: sync keeps nothing of it.
	pv.forget(a)
	pv.store = cache.NewStore(cache.MetaNamespaceKeyFunc)
	pv.members = func(gang.Key) memberSet { return memberSet{} }
	require.NoError(t, pv.sync(context.Background(), a))
	pv.sizes(sizes)
	assert.Equal(t, 0, sizes["provisioning gangs"])
}

// mnistGang is a Job gang of one pending 8-GPU member.
func mnistGang() (gang.Key, []*v1.Pod) {
	return gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "mnist"},
		[]*v1.Pod{testobj.MakePod("ns", "mnist-0").PodSpec(testobj.WorkerPodSpec("muster", 8)).Obj()}
}

// provisionerForTest is a provisioner on fake clients whose Events are
// recorded, with the time at now.
func provisionerForTest(t *testing.T, now time.Time, pending []*v1.Pod) (*provisioner, *[]string, *k8sfake.Clientset, *dynamicfake.FakeDynamicClient) {
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{ProvisioningRequests: "ProvisioningRequestList"})
	core := k8sfake.NewClientset()
	for _, p := range pending {
		_, err := core.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	var events []string
	pv := newProvisioner(autoscalingv1.ProvisioningClassBestEffortAtomicScaleUp, dyn, core,
		func(gang.Key) memberSet { return memberSet{pending: pending, total: len(pending)} }, nil)
	t.Cleanup(pv.queue.ShutDown)
	pv.store = cache.NewStore(cache.MetaNamespaceKeyFunc)
	pv.hasPlan = func(gang.Key) bool { return false }
	pv.event = func(_ gang.Key, eventType, reason, message string) {
		events = append(events, eventType+" "+reason+": "+message)
	}
	pv.nodesArrived = func(gang.Key) {}
	pv.now = func() time.Time { return now }
	return pv, &events, core, dyn
}

// A request the autoscaler never answers is announced once, after 5
// minutes, and kept; a failed one is announced, deleted, and asked again
// only after the backoff.
func TestProvisionerFollowsTheAutoscaler(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	key, pending := mnistGang()
	pv, events, core, dyn := provisionerForTest(t, now, pending)
	ctx := context.Background()
	pv.noticed(gang.Notice{Key: key, Outcome: gang.OutcomeUnschedulable})

	require.NoError(t, pv.sync(ctx, key))
	req, err := dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, requestName(key), metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, *events, 1)
	assert.Contains(t, (*events)[0], gang.ReasonProvisioningRequested)
	tmpls, err := core.CoreV1().PodTemplates("ns").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, tmpls.Items, 1, "one pod set, one template")

	// The informer brings the request; the member consumes it.
	req.SetCreationTimestamp(metav1.NewTime(now))
	require.NoError(t, pv.store.Add(req))
	require.NoError(t, pv.sync(ctx, key))
	pod, err := core.CoreV1().Pods("ns").Get(ctx, "mnist-0", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, req.GetName(), pod.Annotations[ConsumeProvisioningRequestAnnotation])
	assert.Len(t, *events, 1, "nothing to say before 5 minutes without an answer")

	pv.now = func() time.Time { return now.Add(provisioningNotAcceptedAfter + time.Second) }
	require.NoError(t, pv.sync(ctx, key))
	require.NoError(t, pv.sync(ctx, key))
	require.Len(t, *events, 2, "said once")
	assert.Contains(t, (*events)[1], gang.ReasonProvisioningNotAccepted)

	require.NoError(t, unstructured.SetNestedSlice(req.Object, []any{
		map[string]any{"type": "Accepted", "status": "True"},
		map[string]any{"type": "Failed", "status": "True", "reason": "NotProvisioned", "message": "node group at its maximum"}}, "status", "conditions"))
	require.NoError(t, pv.store.Update(req))
	require.NoError(t, pv.sync(ctx, key))
	require.Len(t, *events, 3)
	assert.Contains(t, (*events)[2], "node group at its maximum")
	_, err = dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, req.GetName(), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "a failed request is deleted: %v", err)
	tmpls, err = core.CoreV1().PodTemplates("ns").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, tmpls.Items, "with its templates")

	// Gone from the informer: not asked again before the backoff ends.
	require.NoError(t, pv.store.Delete(req))
	require.NoError(t, pv.sync(ctx, key))
	_, err = dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, req.GetName(), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "asked again during the backoff")
	pv.now = func() time.Time { return now.Add(provisioningNotAcceptedAfter + provisioningRetryBase + 2*time.Second) }
	require.NoError(t, pv.sync(ctx, key))
	_, err = dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, req.GetName(), metav1.GetOptions{})
	assert.NoError(t, err, "asked again after the backoff")
}

// A request the API server refuses (a webhook, a quota) is announced with
// the API's error, and asked again only after the backoff.
func TestProvisionerRefusedByTheAPI(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	key, pending := mnistGang()
	pv, events, _, dyn := provisionerForTest(t, now, pending)
	dyn.PrependReactor("create", "provisioningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(ProvisioningRequests.GroupResource(), requestName(key), errors.New("denied by policy no-provreqs"))
	})
	pv.noticed(gang.Notice{Key: key, Outcome: gang.OutcomeUnschedulable})
	require.NoError(t, pv.sync(context.Background(), key))
	require.Len(t, *events, 1)
	assert.Contains(t, (*events)[0], gang.ReasonProvisioningFailed)
	assert.Contains(t, (*events)[0], "denied by policy no-provreqs")
	assert.Equal(t, now.Add(provisioningRetryBase), pv.gangs[key].retryAt)
	require.NoError(t, pv.sync(context.Background(), key))
	assert.Len(t, *events, 1, "not asked again during the backoff")
}

// A gang that must be in one zone asks for its nodes in the zone with the
// most free GPUs, in every term of its members' own node affinity.
func TestTemplatePinsTheZone(t *testing.T) {
	gpu := v1.ResourceName("nvidia.com/gpu")
	n := &nodeViews{gpu: gpu, kept: map[string]cachedView{}}
	add := func(name, zone string, free int64, reclaiming bool) {
		node := testobj.MakeNode(name).Zone(zone).Obj()
		n.kept[name] = cachedView{view: gang.NewNodeView(node, gang.Resources{Scalars: map[v1.ResourceName]int64{gpu: free}}, gpu, false, reclaiming)}
	}
	add("a1", "z1", 4, false)
	add("a2", "z1", 4, false)
	add("b1", "z2", 6, false)
	add("b2", "z2", 8, true) // being reclaimed: not room
	assert.Equal(t, "z1", n.freestDomain(v1.LabelTopologyZone))
	assert.Equal(t, "", n.freestDomain("example.com/no-such-label"))

	pv := &provisioner{domain: func(*v1.Pod) (string, string) { return v1.LabelTopologyZone, n.freestDomain(v1.LabelTopologyZone) }}
	pod := testobj.MakePod("ns", "w0").PodSpec(testobj.WorkerPodSpec("muster", 8)).Obj()
	own := v1.NodeSelectorRequirement{Key: "pool", Operator: v1.NodeSelectorOpIn, Values: []string{"a"}}
	pod.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
		NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{own}}, {}}}}}
	tmpl := pv.template(pod)
	zone := v1.NodeSelectorRequirement{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{"z1"}}
	terms := tmpl.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	assert.Equal(t, []v1.NodeSelectorRequirement{own, zone}, terms[0].MatchExpressions)
	assert.Equal(t, []v1.NodeSelectorRequirement{zone}, terms[1].MatchExpressions)
	assert.Len(t, pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions, 1, "the member's own spec is not changed")
}

// Capacity revoked after it was provisioned: announced, the request deleted
// and asked again at once the first time, after the backoff the second.
func TestProvisionerCapacityRevoked(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	key, pending := mnistGang()
	pv, events, _, dyn := provisionerForTest(t, now, pending)
	ctx := context.Background()
	pv.noticed(gang.Notice{Key: key, Outcome: gang.OutcomeUnschedulable})
	revoke := func() {
		t.Helper()
		require.NoError(t, pv.sync(ctx, key))
		req, err := dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, requestName(key), metav1.GetOptions{})
		require.NoError(t, err, "a request was made")
		require.NoError(t, unstructured.SetNestedSlice(req.Object, []any{
			map[string]any{"type": "Accepted", "status": "True"},
			map[string]any{"type": "Provisioned", "status": "True"},
			map[string]any{"type": "CapacityRevoked", "status": "True", "reason": "Revoked", "message": "the VMs were taken back"}}, "status", "conditions"))
		req.SetUID(types.UID(fmt.Sprintf("uid-%d", len(*events))))
		require.NoError(t, pv.store.Add(req))
		require.NoError(t, pv.sync(ctx, key))
		require.NoError(t, pv.store.Delete(req))
		_, err = dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, req.GetName(), metav1.GetOptions{})
		require.True(t, apierrors.IsNotFound(err), "a revoked request is deleted: %v", err)
	}
	revoke()
	assert.Contains(t, (*events)[len(*events)-1], gang.ReasonProvisioningEnded)
	assert.Contains(t, (*events)[len(*events)-1], "its capacity was revoked")
	revoke() // asked again at once, and revoked again
	require.NoError(t, pv.sync(ctx, key))
	_, err := dyn.Resource(ProvisioningRequests).Namespace("ns").Get(ctx, requestName(key), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the second time, asked again only after the backoff")
}
