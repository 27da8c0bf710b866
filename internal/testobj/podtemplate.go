package testobj

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podTemplate holds the pod template setters the workload wrappers (Job,
// StatefulSet) share: methods named after a pod field set it in the
// template. Like objectMeta, MakeX wires it to the wrapper (self) and to the
// template of the wrapped object's spec.
type podTemplate[W any] struct {
	self W
	tmpl *corev1.PodTemplateSpec
}

func newPodTemplate[W any](self W, tmpl *corev1.PodTemplateSpec) podTemplate[W] {
	return podTemplate[W]{self: self, tmpl: tmpl}
}

// PodSpec replaces the pod template's spec.
func (t podTemplate[W]) PodSpec(spec corev1.PodSpec) W { t.tmpl.Spec = spec; return t.self }

// PodLabel sets label k to v in the pod template.
func (t podTemplate[W]) PodLabel(k, v string) W {
	metav1.SetMetaDataLabel(&t.tmpl.ObjectMeta, k, v)
	return t.self
}

// PodAnnotation sets annotation k to v in the pod template (muster.dev/*
// annotations are read from the pods).
func (t podTemplate[W]) PodAnnotation(k, v string) W {
	metav1.SetMetaDataAnnotation(&t.tmpl.ObjectMeta, k, v)
	return t.self
}

// SchedulerName sets the scheduler of the pods.
func (t podTemplate[W]) SchedulerName(s string) W { t.tmpl.Spec.SchedulerName = s; return t.self }

// RestartPolicy sets the restart policy of the pods.
func (t podTemplate[W]) RestartPolicy(p corev1.RestartPolicy) W {
	t.tmpl.Spec.RestartPolicy = p
	return t.self
}

// Subdomain sets the pods' subdomain: the headless Service that names them.
func (t podTemplate[W]) Subdomain(s string) W { t.tmpl.Spec.Subdomain = s; return t.self }

// Container adds a container to the pod template.
func (t podTemplate[W]) Container(c corev1.Container) W {
	t.tmpl.Spec.Containers = append(t.tmpl.Spec.Containers, c)
	return t.self
}

// ContainerPorts sets the ports of the template's first container.
func (t podTemplate[W]) ContainerPorts(ports ...corev1.ContainerPort) W {
	t.tmpl.Spec.Containers[0].Ports = ports
	return t.self
}
