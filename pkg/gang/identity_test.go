package gang

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
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
