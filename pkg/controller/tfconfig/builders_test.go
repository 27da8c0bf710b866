package tfconfig

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// jobWrapper builds Jobs for tests: makeJob("ns", "mnist", 3) is an opted-in Indexed Job of 3 tasks
// with subdomain "mnist", shaped as the API server would store it (template labels defaulted).
type jobWrapper struct{ batchv1.Job }

func makeJob(namespace, name string, n int32) *jobWrapper {
	uid := types.UID(fmt.Sprintf("uid-%s-%s", namespace, name))
	return &jobWrapper{batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: uid, Generation: 1, ResourceVersion: "1",
			Labels: map[string]string{OptInLabel: "true"},
		},
		Spec: batchv1.JobSpec{
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Parallelism:    ptr.To(n),
			Completions:    ptr.To(n),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
					batchv1.JobNameLabel:       name,
					batchv1.ControllerUidLabel: string(uid),
				}},
				Spec: corev1.PodSpec{
					Subdomain:     name,
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name:  "tensorflow",
						Image: "tf",
						Ports: []corev1.ContainerPort{{Name: PortName, ContainerPort: 2222, Protocol: corev1.ProtocolTCP}},
					}},
				},
			},
		},
	}}
}

func (w *jobWrapper) obj() *batchv1.Job { return &w.Job }

func (w *jobWrapper) uid(uid types.UID) *jobWrapper { w.UID = uid; return w }

func (w *jobWrapper) label(k, v string) *jobWrapper { w.Labels[k] = v; return w }

func (w *jobWrapper) noLabel(k string) *jobWrapper { delete(w.Labels, k); return w }

func (w *jobWrapper) annotation(k, v string) *jobWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

func (w *jobWrapper) role(r Role) *jobWrapper { return w.annotation(RoleAnnotation, string(r)) }

func (w *jobWrapper) group(g string) *jobWrapper { return w.label(GroupLabel, g) }

func (w *jobWrapper) subdomain(s string) *jobWrapper { w.Spec.Template.Spec.Subdomain = s; return w }

func (w *jobWrapper) port(p int32, proto corev1.Protocol) *jobWrapper {
	w.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: PortName, ContainerPort: p, Protocol: proto}}
	return w
}

func (w *jobWrapper) noPorts() *jobWrapper { w.Spec.Template.Spec.Containers[0].Ports = nil; return w }

func (w *jobWrapper) nonIndexed() *jobWrapper {
	w.Spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	return w
}

func (w *jobWrapper) parallelism(p int32) *jobWrapper { w.Spec.Parallelism = ptr.To(p); return w }

func (w *jobWrapper) size(n int32) *jobWrapper {
	w.Spec.Parallelism, w.Spec.Completions = ptr.To(n), ptr.To(n)
	w.Generation++
	return w
}

func (w *jobWrapper) deleting() *jobWrapper {
	w.DeletionTimestamp = ptr.To(metav1.Now())
	w.Finalizers = []string{metav1.FinalizerOrphanDependents}
	return w
}

// workers returns the worker list of an N-task Job named job with subdomain job in namespace ns.
func workers(ns, job string, n int, port int) string {
	s := ""
	for i := range n {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(`"%s-%d.%s.%s.svc:%d"`, job, i, job, ns, port)
	}
	return "[" + s + "]"
}

func makeSecret(namespace, name string, data string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-secret-" + name), ResourceVersion: "1"},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{ClusterKey: []byte(data)},
	}
}

func makeService(namespace, name string, headless bool, selector map[string]string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-svc-" + name), ResourceVersion: "1"},
		Spec:       corev1.ServiceSpec{Selector: selector, ClusterIP: "10.0.0.1"},
	}
	if headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	return svc
}
