package testobj

import (
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// StatefulSetWrapper builds an apps/v1 StatefulSet. Methods named after a
// pod field set it in the pod template.
type StatefulSetWrapper struct {
	appsv1.StatefulSet
	objectMeta[*StatefulSetWrapper]
	podTemplate[*StatefulSetWrapper]
}

// MakeStatefulSet starts StatefulSet namespace/name with an empty spec.
func MakeStatefulSet(namespace, name string) *StatefulSetWrapper {
	s := &StatefulSetWrapper{StatefulSet: appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
	s.objectMeta = newObjectMeta(s, &s.ObjectMeta)
	s.podTemplate = newPodTemplate(s, &s.Spec.Template)
	return s
}

// Obj returns the StatefulSet.
func (s *StatefulSetWrapper) Obj() *appsv1.StatefulSet { return &s.StatefulSet }

// TypeMeta sets apiVersion and kind, as a decoded manifest has them.
func (s *StatefulSetWrapper) TypeMeta() *StatefulSetWrapper {
	s.StatefulSet.TypeMeta = metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "StatefulSet"}
	return s
}

// Replicas sets the number of pods.
func (s *StatefulSetWrapper) Replicas(n int32) *StatefulSetWrapper {
	s.Spec.Replicas = ptr.To(n)
	return s
}

// Scale sets the replicas as a spec change does: the generation goes up.
func (s *StatefulSetWrapper) Scale(n int32) *StatefulSetWrapper {
	s.ObjectMeta.Generation++
	return s.Replicas(n)
}

// ServiceName sets the headless Service that names the pods.
func (s *StatefulSetWrapper) ServiceName(name string) *StatefulSetWrapper {
	s.Spec.ServiceName = name
	return s
}

// PodManagementPolicy sets how the pods are created (Parallel: all at once).
func (s *StatefulSetWrapper) PodManagementPolicy(p appsv1.PodManagementPolicyType) *StatefulSetWrapper {
	s.Spec.PodManagementPolicy = p
	return s
}

// SelectPods gives the pod template labels and selects the pods by them
// (selector and template share the map).
func (s *StatefulSetWrapper) SelectPods(labels map[string]string) *StatefulSetWrapper {
	s.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	s.Spec.Template.Labels = labels
	return s
}
