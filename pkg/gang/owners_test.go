package gang

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// ownerMap is a gang.Owners over objects by name (one namespace, "ns");
// broken, when set, is every PodGroup read's error.
type ownerMap struct {
	objects map[string]runtime.Object
	broken  error
}

func find[T runtime.Object](m ownerMap, resource, name string) (T, error) {
	if o, ok := m.objects[name].(T); ok {
		return o, nil
	}
	var none T
	return none, apierrors.NewNotFound(batchv1.Resource(resource), name)
}

func (m ownerMap) Job(_, name string) (*batchv1.Job, error) {
	return find[*batchv1.Job](m, "jobs", name)
}
func (m ownerMap) StatefulSet(_, name string) (*appsv1.StatefulSet, error) {
	return find[*appsv1.StatefulSet](m, "statefulsets", name)
}
func (m ownerMap) PodGroup(_, name string) (*v1alpha1.PodGroup, error) {
	if m.broken != nil {
		return nil, m.broken
	}
	return find[*v1alpha1.PodGroup](m, "podgroups", name)
}
func (m ownerMap) WorkloadPodGroup(_, name string) (*schedulingv1beta1.PodGroup, error) {
	return find[*schedulingv1beta1.PodGroup](m, "podgroups", name)
}

// Resolve finds the gang and the object that defines its quorum, the same
// way for the scheduler and kubectl muster: a basic Kubernetes PodGroup
// hands the quorum to the pods' controller, a missing owner is named, and
// a reader's own error reaches the user unchanged.
func TestResolve(t *testing.T) {
	job := testobj.MakeJob("ns", "train").Workers(4).Obj()
	basic := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "basic"}}
	gangGroup := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "whole"},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 3}}}}
	group := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}, Spec: v1alpha1.PodGroupSpec{MinMember: 5}}
	owners := ownerMap{objects: map[string]runtime.Object{"train": job, "basic": basic, "whole": gangGroup, "pg": group}}
	jobKey := Key{Kind: KindJob, Namespace: "ns", Name: "train"}
	pod := func() *testobj.PodWrapper { return testobj.MakePod("ns", "p") }

	for _, tc := range []struct {
		name        string
		pod         *v1.Pod
		owners      ownerMap
		notInGang   bool
		key, owner  Key
		quorum      int
		err         string
		ownerObject bool // Owner was read
	}{
		{name: "alone", pod: pod().Obj(), notInGang: true},
		{name: "Job", pod: pod().OwnedByJob("train", "uid").Obj(), key: jobKey, owner: jobKey, quorum: 4, ownerObject: true},
		{name: "Job missing", pod: pod().OwnedByJob("gone", "uid").Obj(), key: Key{Kind: KindJob, Namespace: "ns", Name: "gone"},
			owner: Key{Kind: KindJob, Namespace: "ns", Name: "gone"}, err: "gang ns/gone: Job gone not found in namespace ns"},
		{name: "gang PodGroup", pod: pod().PodGroup("whole").OwnedByJob("train", "uid").Obj(),
			key: Key{Kind: KindWorkloadPodGroup, Namespace: "ns", Name: "whole"}, owner: Key{Kind: KindWorkloadPodGroup, Namespace: "ns", Name: "whole"}, quorum: 3, ownerObject: true},
		{name: "basic PodGroup: the controller's quorum", pod: pod().PodGroup("basic").OwnedByJob("train", "uid").Obj(),
			key: Key{Kind: KindWorkloadPodGroup, Namespace: "ns", Name: "basic"}, owner: jobKey, quorum: 4, ownerObject: true},
		{name: "basic PodGroup, no controller: alone", pod: pod().PodGroup("basic").Obj(), notInGang: true},
		{name: "basic PodGroup, controller missing", pod: pod().PodGroup("basic").OwnedByJob("gone", "uid").Obj(),
			key: Key{Kind: KindWorkloadPodGroup, Namespace: "ns", Name: "basic"}, owner: Key{Kind: KindJob, Namespace: "ns", Name: "gone"},
			err: "gang ns/gone: Job gone not found in namespace ns"},
		{name: "scheduler-plugins PodGroup, 2 succeeded", pod: pod().Label(v1alpha1.PodGroupLabel, "pg").Obj(),
			key: Key{Kind: KindPodGroup, Namespace: "ns", Name: "pg"}, owner: Key{Kind: KindPodGroup, Namespace: "ns", Name: "pg"}, quorum: 3, ownerObject: true},
		{name: "reader's own error", pod: pod().Label(v1alpha1.PodGroupLabel, "pg").Obj(), owners: ownerMap{objects: owners.objects, broken: errors.New("the PodGroup API is not installed")},
			key: Key{Kind: KindPodGroup, Namespace: "ns", Name: "pg"}, owner: Key{Kind: KindPodGroup, Namespace: "ns", Name: "pg"}, err: "the PodGroup API is not installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.owners
			if o.objects == nil {
				o = owners
			}
			succeeded := func(k Key) int {
				assert.Equal(t, KindPodGroup, k.Kind, "only a scheduler-plugins PodGroup's successes are asked for")
				return 2
			}
			r, ok, err := Resolve(tc.pod, o, nil, succeeded)
			assert.Equal(t, !tc.notInGang, ok, "in a gang")
			if tc.notInGang {
				assert.NoError(t, err)
				return
			}
			assert.Equal(t, tc.key, r.Key, "gang")
			assert.Equal(t, tc.owner, r.OwnerKey, "owner")
			assert.Equal(t, tc.ownerObject, r.Owner != nil, "owner read")
			if tc.err != "" {
				assert.EqualError(t, err, tc.err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.quorum, r.Quorum, "quorum")
		})
	}
}
