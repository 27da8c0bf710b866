package mustergang

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	autoscalingv1 "k8s.io/autoscaler/cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1"
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
	assert.Equal(t, 2, pv.queue.Len(), "a and b queued to delete any request they have")

	// a's pods are gone and it has no request: sync keeps nothing of it.
	pv.forget(a)
	pv.store = cache.NewStore(cache.MetaNamespaceKeyFunc)
	pv.members = func(gang.Key) memberSet { return memberSet{} }
	require.NoError(t, pv.sync(context.Background(), a))
	pv.sizes(sizes)
	assert.Equal(t, 0, sizes["provisioning gangs"])
}
