package gang

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// AskOf reads each kind of owner as the scheduler and kubectl muster both
// need it: the quorum, the owner's own timeout and topology, a set that
// can never be one gang, and an owner that cannot be served.
func TestAskOf(t *testing.T) {
	levels := []Level{{Name: "node", Label: v1.LabelHostname}, {Name: "rack", Label: "example.com/rack"}, {Name: "zone", Label: v1.LabelTopologyZone}}
	pod := testobj.MakePod("ns", "p").Obj()
	withMin := func(n string) *v1.Pod { return testobj.MakePod("ns", "p").Annotation(AnnotationMinAvailable, n).Obj() }
	set := func(replicas int32, policy appsv1.PodManagementPolicyType) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(replicas), PodManagementPolicy: policy}}
	}
	group := func(min, succeeded int32, timeout *int32) *v1alpha1.PodGroup {
		return &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"},
			Spec: v1alpha1.PodGroupSpec{MinMember: min, ScheduleTimeoutSeconds: timeout}, Status: v1alpha1.PodGroupStatus{Succeeded: succeeded}}
	}
	workload := func(min int32, topology ...string) *schedulingv1beta1.PodGroup {
		pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w"}}
		if min > 0 {
			pg.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: min}
		}
		if len(topology) > 0 {
			pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{}
			for _, key := range topology {
				pg.Spec.SchedulingConstraints.Topology = append(pg.Spec.SchedulingConstraints.Topology, schedulingv1beta1.TopologyConstraint{Key: key})
			}
		}
		return pg
	}
	for _, tc := range []struct {
		name      string
		owner     runtime.Object
		pod       *v1.Pod
		succeeded int
		want      Ask
		noGang    bool
		err       string
	}{
		{name: "Job", owner: testobj.MakeJob("ns", "j").Workers(4).Obj(), pod: pod, want: Ask{Quorum: 4}},
		{name: "Job, min-available", owner: testobj.MakeJob("ns", "j").Workers(4).Obj(), pod: withMin("3"), want: Ask{Quorum: 3}},
		{name: "StatefulSet, Parallel", owner: set(3, appsv1.ParallelPodManagement), pod: pod, want: Ask{Quorum: 3}},
		{name: "StatefulSet, OrderedReady", owner: set(3, appsv1.OrderedReadyPodManagement), pod: pod, want: Ask{Quorum: 1}, noGang: true},
		{name: "StatefulSet of one, OrderedReady", owner: set(1, appsv1.OrderedReadyPodManagement), pod: pod, want: Ask{Quorum: 1}},
		{name: "PodGroup", owner: group(4, 0, nil), pod: pod, want: Ask{Quorum: 4}},
		{name: "PodGroup, finished members", owner: group(4, 1, nil), pod: pod, succeeded: 2, want: Ask{Quorum: 2}},
		{name: "PodGroup, all finished", owner: group(4, 4, nil), pod: pod, want: Ask{Quorum: 1}},
		{name: "PodGroup, timeout", owner: group(2, 0, ptr.To[int32](30)), pod: pod, want: Ask{Quorum: 2, Timeout: 30 * time.Second}},
		{name: "PodGroup, minMember 0", owner: group(0, 0, nil), pod: pod, err: "spec.minMember must be at least 1"},
		{name: "Kubernetes PodGroup", owner: workload(4), pod: pod, want: Ask{Quorum: 4}},
		{name: "Kubernetes PodGroup, min-available", owner: workload(4), pod: withMin("2"), want: Ask{Quorum: 2}},
		{name: "Kubernetes PodGroup, min-available above minCount", owner: workload(4), pod: withMin("5"), err: "gang.minCount is 4"},
		{name: "Kubernetes PodGroup, topology", owner: workload(2, v1.LabelTopologyZone, "example.com/rack"), pod: pod, want: Ask{Quorum: 2, Required: "rack"}},
		{name: "Kubernetes PodGroup, unknown topology key", owner: workload(2, "example.com/pod"), pod: pod, err: `topology key "example.com/pod" is no topology level's nodeLabel`},
		{name: "Kubernetes PodGroup, basic", owner: workload(0), pod: pod, err: "basic policy"},
		{name: "a pod", owner: pod, pod: pod, err: "defines no gang"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AskOf(tc.owner, tc.pod, levels, tc.succeeded)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.noGang, got.NoGang != "", got.NoGang)
			got.NoGang = ""
			assert.Equal(t, tc.want, got)
		})
	}
}
