package testobj

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// StatefulSetWrapper builds an apps/v1 StatefulSet. Methods named after a
// pod field set it in the pod template.
type StatefulSetWrapper struct{ appsv1.StatefulSet }

// MakeStatefulSet starts StatefulSet namespace/name with an empty spec.
func MakeStatefulSet(namespace, name string) *StatefulSetWrapper {
	return &StatefulSetWrapper{appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
}

// Obj returns the StatefulSet.
func (s *StatefulSetWrapper) Obj() *appsv1.StatefulSet { return &s.StatefulSet }

// TypeMeta sets apiVersion and kind, as a decoded manifest has them.
func (s *StatefulSetWrapper) TypeMeta() *StatefulSetWrapper {
	s.StatefulSet.TypeMeta = metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "StatefulSet"}
	return s
}

// UID sets the StatefulSet's UID.
func (s *StatefulSetWrapper) UID(uid string) *StatefulSetWrapper {
	s.ObjectMeta.UID = types.UID(uid)
	return s
}

// Generation sets the StatefulSet's generation.
func (s *StatefulSetWrapper) Generation(g int64) *StatefulSetWrapper {
	s.ObjectMeta.Generation = g
	return s
}

// ResourceVersion sets the StatefulSet's resource version.
func (s *StatefulSetWrapper) ResourceVersion(rv string) *StatefulSetWrapper {
	s.ObjectMeta.ResourceVersion = rv
	return s
}

// Created sets the creation timestamp.
func (s *StatefulSetWrapper) Created(t time.Time) *StatefulSetWrapper {
	s.CreationTimestamp = metav1.NewTime(t)
	return s
}

// Label sets label k to v on the StatefulSet.
func (s *StatefulSetWrapper) Label(k, v string) *StatefulSetWrapper {
	metav1.SetMetaDataLabel(&s.ObjectMeta, k, v)
	return s
}

// Annotation sets annotation k to v on the StatefulSet.
func (s *StatefulSetWrapper) Annotation(k, v string) *StatefulSetWrapper {
	metav1.SetMetaDataAnnotation(&s.ObjectMeta, k, v)
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

// PodSpec replaces the pod template's spec.
func (s *StatefulSetWrapper) PodSpec(spec corev1.PodSpec) *StatefulSetWrapper {
	s.Spec.Template.Spec = spec
	return s
}

// SchedulerName sets the scheduler of the pods.
func (s *StatefulSetWrapper) SchedulerName(name string) *StatefulSetWrapper {
	s.Spec.Template.Spec.SchedulerName = name
	return s
}

// RestartPolicy sets the restart policy of the pods.
func (s *StatefulSetWrapper) RestartPolicy(p corev1.RestartPolicy) *StatefulSetWrapper {
	s.Spec.Template.Spec.RestartPolicy = p
	return s
}

// Container adds a container to the pod template.
func (s *StatefulSetWrapper) Container(c corev1.Container) *StatefulSetWrapper {
	s.Spec.Template.Spec.Containers = append(s.Spec.Template.Spec.Containers, c)
	return s
}

// ContainerPorts sets the ports of the template's first container.
func (s *StatefulSetWrapper) ContainerPorts(ports ...corev1.ContainerPort) *StatefulSetWrapper {
	s.Spec.Template.Spec.Containers[0].Ports = ports
	return s
}
