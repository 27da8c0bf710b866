package gang

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

func TestKeyOf(t *testing.T) {
	job := testobj.MakeJob("ns", "train").UID("job-uid").Obj()
	tests := []struct {
		name   string
		pod    *v1.Pod
		want   Key
		inGang bool
	}{
		{"alone", testobj.MakePod("ns", "p").Obj(), Key{}, false},
		{"job", testobj.MakePod("ns", "p").JobMember(job, 0).Obj(), Key{KindJob, "ns", "train"}, true},
		{"scheduler-plugins PodGroup label", testobj.MakePod("ns", "p").Label(v1alpha1.PodGroupLabel, "pg").JobMember(job, 0).Obj(),
			Key{KindPodGroup, "ns", "pg"}, true},
		{"Kubernetes PodGroup before label and owner",
			testobj.MakePod("ns", "p").PodGroup("native").Label(v1alpha1.PodGroupLabel, "pg").JobMember(job, 0).Obj(),
			Key{KindWorkloadPodGroup, "ns", "native"}, true},
		{"empty schedulingGroup name is no group", func() *v1.Pod {
			pod := testobj.MakePod("ns", "p").JobMember(job, 0).Obj()
			pod.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("")}
			return pod
		}(), Key{KindJob, "ns", "train"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := KeyOf(tc.pod)
			require.Equal(t, tc.inGang, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestControllerKeyIgnoresGroups(t *testing.T) {
	job := testobj.MakeJob("ns", "train").UID("job-uid").Obj()
	key, ok := ControllerKey(testobj.MakePod("ns", "p").PodGroup("native").JobMember(job, 0).Obj())
	require.True(t, ok)
	assert.Equal(t, Key{KindJob, "ns", "train"}, key)
	_, ok = ControllerKey(testobj.MakePod("ns", "p").PodGroup("native").Obj())
	assert.False(t, ok)
}

func TestOwnerKind(t *testing.T) {
	tests := []struct {
		name       string
		apiVersion string
		kind       string
		want       Kind
		ok         bool
	}{
		{"Job", "batch/v1", "Job", KindJob, true},
		{"StatefulSet", "apps/v1", "StatefulSet", KindStatefulSet, true},
		{"Job in another version of its group", "batch/v2", "Job", KindJob, true},
		{"StatefulSet in another version of its group", "apps/v1beta2", "StatefulSet", KindStatefulSet, true},
		{"Job kind in the wrong group", "apps/v1", "Job", "", false},
		{"StatefulSet kind in the wrong group", "batch/v1", "StatefulSet", "", false},
		{"kind compared case-sensitively", "batch/v1", "job", "", false},
		{"other workload", "apps/v1", "ReplicaSet", "", false},
		{"core group", "v1", "Pod", "", false},
		{"group without version", "batch", "Job", "", false},
		{"empty apiVersion", "", "Job", "", false},
		{"malformed apiVersion", "batch/v1/x", "Job", "", false},
		{"gang kind that is no owner", "scheduling.x-k8s.io/v1alpha1", "PodGroup", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := OwnerKind(tc.apiVersion, tc.kind)
			require.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// Every kind OwnerKind returns has the API type that owner references to
// it are written with, and OwnerKind reads that type back as the kind.
func TestKindGroupVersionKind(t *testing.T) {
	tests := []struct {
		kind       Kind
		apiVersion string
		typeKind   string
	}{
		{KindJob, "batch/v1", "Job"},
		{KindStatefulSet, "apps/v1", "StatefulSet"},
		{KindPod, "", ""},
		{KindPodGroup, "", ""},
		{KindWorkloadPodGroup, "", ""},
	}
	for _, tc := range tests {
		t.Run(string(tc.kind), func(t *testing.T) {
			apiVersion, typeKind := tc.kind.GroupVersionKind().ToAPIVersionAndKind()
			assert.Equal(t, tc.apiVersion, apiVersion)
			assert.Equal(t, tc.typeKind, typeKind)
			if typeKind == "" {
				return
			}
			back, ok := OwnerKind(apiVersion, typeKind)
			require.True(t, ok)
			assert.Equal(t, tc.kind, back)
		})
	}
}

// ControllerKey, unlike OwnerKind, takes only the versions muster reads.
func TestControllerKeyVersions(t *testing.T) {
	pod := func(apiVersion, kind string, controller bool) *v1.Pod {
		p := testobj.MakePod("ns", "p").Obj()
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "w", UID: "uid", Controller: ptr.To(controller)}}
		return p
	}
	tests := []struct {
		name string
		pod  *v1.Pod
		want Key
		ok   bool
	}{
		{"batch/v1 Job", pod("batch/v1", "Job", true), Key{KindJob, "ns", "w"}, true},
		{"apps/v1 StatefulSet", pod("apps/v1", "StatefulSet", true), Key{KindStatefulSet, "ns", "w"}, true},
		{"batch/v2 Job", pod("batch/v2", "Job", true), Key{}, false},
		{"apps/v1beta2 StatefulSet", pod("apps/v1beta2", "StatefulSet", true), Key{}, false},
		{"owner that does not control", pod("batch/v1", "Job", false), Key{}, false},
		{"ReplicaSet", pod("apps/v1", "ReplicaSet", true), Key{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ControllerKey(tc.pod)
			require.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestKeyString(t *testing.T) {
	assert.Equal(t, "ns/podgroup.scheduling.k8s.io/g", Key{KindWorkloadPodGroup, "ns", "g"}.String())
	assert.Equal(t, "ns/podgroup/g", Key{KindPodGroup, "ns", "g"}.String())
}

func TestNarrowerLevel(t *testing.T) {
	levels := []Level{{Name: "node"}, {Name: "nvlink"}, {Name: "rack"}, {Name: "zone"}}
	tests := []struct{ a, b, want string }{
		{"", "", ""},
		{"", "rack", "rack"},
		{"zone", "", "zone"},
		{"zone", "rack", "rack"},
		{"nvlink", "rack", "nvlink"},
		{"rack", "rack", "rack"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, NarrowerLevel(levels, tc.a, tc.b), "NarrowerLevel(%q, %q)", tc.a, tc.b)
	}
}

// A pod scheduled alone is named as a pod in messages, a gang as a gang.
func TestKeySubject(t *testing.T) {
	lone := LoneKey(testobj.MakePod("ns", "web").Obj())
	if got := lone.Subject(); got != "pod ns/web" {
		t.Errorf("pod alone: %q, want %q", got, "pod ns/web")
	}
	job := Key{Kind: KindJob, Namespace: "ns", Name: "train"}
	if got := job.Subject(); got != "gang "+job.String() {
		t.Errorf("Job gang: %q, want %q", got, "gang "+job.String())
	}
}
