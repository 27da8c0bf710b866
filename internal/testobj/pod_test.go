package testobj

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A node set before the spec stays: the background pods of the integration
// tests are built that way and must be bound.
func TestPodSpecKeepsTheNode(t *testing.T) {
	pod := MakePod("ns", "p").Node("n1").PodSpec(corev1.PodSpec{SchedulerName: "s"}).Obj()
	if pod.Spec.NodeName != "n1" || pod.Spec.SchedulerName != "s" {
		t.Fatalf("node %q scheduler %q, want n1 and s", pod.Spec.NodeName, pod.Spec.SchedulerName)
	}
	pod = MakePod("ns", "p").Node("n1").PodSpec(corev1.PodSpec{NodeName: "n2"}).Obj()
	if pod.Spec.NodeName != "n2" {
		t.Fatalf("node %q, want the spec's n2", pod.Spec.NodeName)
	}
}
