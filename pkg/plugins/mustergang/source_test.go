package mustergang

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// sourceWithOwners is a gang source whose listers hold objs (Jobs and
// StatefulSets), without the PodGroup CRD.
func sourceWithOwners(t *testing.T, objs ...interface{}) *gangSource {
	t.Helper()
	jobs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	sets := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, o := range objs {
		store := jobs
		switch o.(type) {
		case *appsv1.StatefulSet:
			store = sets
		case *v1.Pod:
			store = pods
		}
		require.NoError(t, store.Add(o))
	}
	return &gangSource{gangs: gang.NewManager(), defaultTimeout: time.Minute, pods: pods,
		jobs: batchlisters.NewJobLister(jobs), sets: appslisters.NewStatefulSetLister(sets)}
}

func statefulSetPod(set string) *v1.Pod {
	pod := testobj.MakePod("ns", set+"-0").Obj()
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: set, UID: "sts-uid", Controller: ptr.To(true)}}
	return pod
}

// resolved resolves pod with src, checks whether it is in a gang and its
// error, and returns its gang's info and the owner it names for Events when
// there is more to check (nil when the case ends here).
func resolved(t *testing.T, src *gangSource, pod *v1.Pod, inGang bool, errPart string) (*gang.Resolved, *v1.ObjectReference) {
	t.Helper()
	info, got, err := src.resolve(pod)
	require.Equal(t, inGang, got)
	if errPart != "" {
		require.ErrorContains(t, err, errPart)
		return nil, nil
	}
	require.NoError(t, err)
	if !inGang {
		return nil, nil
	}
	require.NotNil(t, info.Ref, "owner")
	return info, info.Ref
}

func TestResolve(t *testing.T) {
	job := testobj.MakeJob("ns", "train").UID("job-uid").Workers(4).Obj()
	parallel := testobj.MakeStatefulSet("ns", "ps").Replicas(3).PodManagementPolicy(appsv1.ParallelPodManagement).Obj()
	ordered := testobj.MakeStatefulSet("ns", "ordered").Replicas(3).Obj()
	src := sourceWithOwners(t, job, parallel, ordered)

	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		inGang   bool
		quorum   int
		ownerRef string // kind/name of the Event target
		noGang   bool
		errPart  string
	}{
		{name: "a pod alone", pod: testobj.MakePod("ns", "web").Obj()},
		{name: "a Job's worker", pod: testobj.MakePod("ns", "train-0").OwnedByJob("train", "job-uid").Obj(),
			inGang: true, quorum: 4, ownerRef: "Job/train"},
		{name: "a Job that is gone", pod: testobj.MakePod("ns", "old-0").OwnedByJob("old", "old-uid").Obj(),
			inGang: true, errPart: "gang ns/old: Job old not found in namespace ns"},
		{name: "a Parallel StatefulSet", pod: statefulSetPod("ps"), inGang: true, quorum: 3, ownerRef: "StatefulSet/ps"},
		{name: "an OrderedReady StatefulSet is placed pod by pod", pod: statefulSetPod("ordered"),
			inGang: true, quorum: 1, ownerRef: "StatefulSet/ordered", noGang: true},
		{name: "a PodGroup label without the CRD", pod: testobj.MakePod("ns", "p").Label(v1alpha1.PodGroupLabel, "pg").Obj(),
			inGang: true, errPart: "the PodGroup API (podgroups.scheduling.x-k8s.io) is not installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, ref := resolved(t, src, tc.pod, tc.inGang, tc.errPart)
			if info == nil {
				return
			}
			assert.Equal(t, tc.quorum, info.Quorum)
			assert.Equal(t, time.Minute, info.Timeout)
			assert.Equal(t, tc.noGang, info.NoGang != "", info.NoGang)
			assert.Equal(t, tc.ownerRef, ref.Kind+"/"+ref.Name)
			assert.Equal(t, ref, src.ownerRef(info.Key), "resolve and ownerRef name the same owner")
		})
	}
}

// The Event target of a gang whose owner cannot be read is none, never a
// typed nil the recorder would dereference.
func TestOwnerRefOfMissingOwners(t *testing.T) {
	src := sourceWithOwners(t)
	for _, key := range []gang.Key{
		{Kind: gang.KindJob, Namespace: "ns", Name: "gone"},
		{Kind: gang.KindStatefulSet, Namespace: "ns", Name: "gone"},
		{Kind: gang.KindPodGroup, Namespace: "ns", Name: "no-crd"},
		gang.LoneKey(testobj.MakePod("ns", "alone").Obj()),
	} {
		assert.Nil(t, src.ownerRef(key), "%s", key)
	}
}

// A pod scheduled alone that preempted is its own Event target.
func TestOwnerRefOfAPodAlone(t *testing.T) {
	pod := testobj.MakePod("ns", "alone").UID("alone-uid").Obj()
	src := sourceWithOwners(t, pod)
	assert.Equal(t, &v1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: "alone", UID: "alone-uid"},
		src.ownerRef(gang.LoneKey(pod)))
}
