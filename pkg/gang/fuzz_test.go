package gang

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Any annotation values: parsing never panics, accepts only what it
// documents, and every rejection names the annotation.
func FuzzAnnotations(f *testing.F) {
	f.Add("rack", "zone", "avoid", "3", int32(4))
	f.Add("pod", "", "sometimes", "0", int32(1))
	f.Add("", "nvlink", "", "-1", int32(0))
	f.Add("node", "node", "require", "99999999999999999999", int32(2))
	f.Add("Rack", " rack", "Prefer", "2 ", int32(3))
	f.Fuzz(func(t *testing.T, required, preferred, policy, minAvailable string, parallelism int32) {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			AnnotationTopologyRequired: required, AnnotationTopologyPreferred: preferred,
			AnnotationPreemptible: policy, AnnotationMinAvailable: minAvailable,
		}}}
		c, err := ConstraintsFromPod(pod, defaultLevels)
		if err != nil {
			if !strings.Contains(err.Error(), "muster.dev/") {
				t.Fatalf("error does not name the annotation: %v", err)
			}
		} else {
			if _, perr := ParsePolicy(string(c.Policy)); perr != nil || c.Policy == "" {
				t.Fatalf("accepted policy %q for %q", c.Policy, policy)
			}
			for _, level := range []string{c.Required, c.Preferred} {
				if level != "" && !knownLevel(level) {
					t.Fatalf("accepted unknown level %q", level)
				}
			}
		}
		job := &batchv1.Job{Spec: batchv1.JobSpec{Parallelism: ptr.To(parallelism)}}
		n, err := JobQuorum(job, pod)
		switch {
		case err != nil:
			if !strings.Contains(err.Error(), AnnotationMinAvailable) {
				t.Fatalf("quorum error does not name the annotation: %v", err)
			}
		case n < 1 || n > max(int(parallelism), 1):
			t.Fatalf("quorum %d outside [1, parallelism %d] for %q", n, parallelism, minAvailable)
		}
	})
}

func knownLevel(name string) bool {
	for _, l := range defaultLevels {
		if l.Name == name {
			return true
		}
	}
	return false
}

// Gang identity depends only on the pod: PodGroup label first, then a
// controlling batch/v1 Job or apps/v1 StatefulSet, never another namespace.
func FuzzKeyOf(f *testing.F) {
	f.Add("ns", "pg", "Job", "batch/v1", "job", true)
	f.Add("ns", "", "Job", "batch/v1", "job", true)
	f.Add("ns", "", "Job", "batch/v2", "job", true)
	f.Add("ns", "", "ReplicaSet", "apps/v1", "rs", true)
	f.Add("ns", "", "StatefulSet", "apps/v1", "sts", true)
	f.Add("ns", "", "StatefulSet", "apps/v1beta1", "sts", true)
	f.Add("ns", "", "Job", "batch/v1", "job", false)
	f.Fuzz(func(t *testing.T, namespace, group, kind, apiVersion, owner string, controller bool) {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Labels:    map[string]string{"scheduling.x-k8s.io/pod-group": group},
			OwnerReferences: []metav1.OwnerReference{{
				Kind: kind, APIVersion: apiVersion, Name: owner, Controller: ptr.To(controller),
			}},
		}}
		key, ok := KeyOf(pod)
		switch {
		case group != "":
			if !ok || key.Kind != KindPodGroup || key.Name != group || key.Namespace != namespace {
				t.Fatalf("PodGroup label %q gave %+v, %v", group, key, ok)
			}
		case controller && kind == "Job" && apiVersion == "batch/v1":
			if !ok || key.Kind != KindJob || key.Name != owner || key.Namespace != namespace {
				t.Fatalf("Job owner %q gave %+v, %v", owner, key, ok)
			}
		case controller && kind == "StatefulSet" && apiVersion == "apps/v1":
			if !ok || key.Kind != KindStatefulSet || key.Name != owner || key.Namespace != namespace {
				t.Fatalf("StatefulSet owner %q gave %+v, %v", owner, key, ok)
			}
		default:
			if ok {
				t.Fatalf("pod without PodGroup or controlling Job or StatefulSet joined gang %+v", key)
			}
		}
	})
}
