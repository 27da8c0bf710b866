package gang

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

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
			r, ok, err := Resolver{Owners: o, Succeeded: succeeded}.Resolve(tc.pod)
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
				assert.Zero(t, r.Quorum, "no quorum when the ask is not read")
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.quorum, r.Quorum, "quorum")
		})
	}
}

// Resolve gives every pod its own annotations, and a gang the object its
// Events go on and the plan deadline in force: the default, the owner's
// own, and never past the framework's longest Permit wait.
func TestResolverSaysWhereEventsGoAndHowLongAPlanLasts(t *testing.T) {
	job := testobj.MakeJob("ns", "train").UID("job-uid").Workers(2).Obj()
	short := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "short", UID: "pg-uid"},
		Spec: v1alpha1.PodGroupSpec{MinMember: 2, ScheduleTimeoutSeconds: ptr.To[int32](30)}}
	long := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "long"},
		Spec: v1alpha1.PodGroupSpec{MinMember: 2, ScheduleTimeoutSeconds: ptr.To[int32](3600)}}
	orphanGroup := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "basic", UID: "group-uid"}}
	rs := Resolver{Owners: ownerMap{objects: map[string]runtime.Object{"train": job, "short": short, "long": long, "basic": orphanGroup}},
		Levels: []Level{{Name: "rack"}}, DefaultTimeout: time.Minute}
	pod := func() *testobj.PodWrapper { return testobj.MakePod("ns", "p") }

	r, ok, err := rs.Resolve(pod().OwnedByJob("train", "job-uid").Annotation(AnnotationTopologyRequired, "rack").Obj())
	assert.True(t, ok)
	assert.NoError(t, err)
	assert.Equal(t, &v1.ObjectReference{APIVersion: "batch/v1", Kind: "Job", Namespace: "ns", Name: "train", UID: "job-uid"}, r.Ref)
	assert.Equal(t, types.UID("job-uid"), r.OwnerUID)
	assert.Equal(t, time.Minute, r.Timeout, "the default")
	assert.Equal(t, "rack", r.Constraints.Required)

	r, _, _ = rs.Resolve(pod().Label(v1alpha1.PodGroupLabel, "short").Obj())
	assert.Equal(t, 30*time.Second, r.Timeout, "the PodGroup's own")
	assert.Equal(t, types.UID("pg-uid"), r.OwnerUID)
	r, _, _ = rs.Resolve(pod().Label(v1alpha1.PodGroupLabel, "long").Obj())
	assert.Equal(t, MaxPlanTimeout, r.Timeout, "cut where the framework cuts a Permit wait")

	// The basic group's controller is gone: Events go on the group, and
	// no record is written under the controller's name.
	r, ok, err = rs.Resolve(pod().PodGroup("basic").OwnedByJob("gone", "gone-uid").Obj())
	assert.True(t, ok)
	assert.Error(t, err)
	assert.Equal(t, "PodGroup", r.Ref.Kind)
	assert.Empty(t, r.OwnerUID)

	// A pod alone has its annotations read, and explained when invalid.
	r, ok, err = rs.Resolve(pod().Annotation(AnnotationPreemptible, string(PolicyPrefer)).Obj())
	assert.False(t, ok)
	assert.NoError(t, err)
	assert.Equal(t, PolicyPrefer, r.Constraints.Policy)
	_, ok, err = rs.Resolve(pod().Annotation(AnnotationTopologyRequired, "planet").Obj())
	assert.False(t, ok)
	assert.ErrorContains(t, err, "unknown topology level")
}
