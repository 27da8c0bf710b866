package tfconfig

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
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

func (w *jobWrapper) created(t metav1.Time) *jobWrapper { w.CreationTimestamp = t; return w }

func (w *jobWrapper) deleting() *jobWrapper {
	w.DeletionTimestamp = ptr.To(metav1.Now())
	w.Finalizers = []string{metav1.FinalizerOrphanDependents}
	return w
}

// setWrapper builds StatefulSets for tests: makeSet("ns", "tf", 3) is an opted-in Parallel StatefulSet
// of 3 replicas with serviceName "tf", selecting its pods by app=tf.
type setWrapper struct{ appsv1.StatefulSet }

func makeSet(namespace, name string, n int32) *setWrapper {
	labels := map[string]string{"app": name}
	return &setWrapper{appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: types.UID(fmt.Sprintf("uid-sts-%s-%s", namespace, name)),
			Generation: 1, ResourceVersion: "1",
			Labels: map[string]string{OptInLabel: "true"},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(n),
			ServiceName:         name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
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

func (w *setWrapper) obj() *appsv1.StatefulSet { return &w.StatefulSet }

func (w *setWrapper) label(k, v string) *setWrapper { w.Labels[k] = v; return w }

func (w *setWrapper) noLabel(k string) *setWrapper { delete(w.Labels, k); return w }

func (w *setWrapper) annotation(k, v string) *setWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

func (w *setWrapper) role(r Role) *setWrapper { return w.annotation(RoleAnnotation, string(r)) }

func (w *setWrapper) group(g string) *setWrapper { return w.label(GroupLabel, g) }

func (w *setWrapper) serviceName(s string) *setWrapper { w.Spec.ServiceName = s; return w }

func (w *setWrapper) port(p int32, proto corev1.Protocol) *setWrapper {
	w.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: PortName, ContainerPort: p, Protocol: proto}}
	return w
}

// scale sets the replicas as a spec change does: the API server bumps the generation.
func (w *setWrapper) scale(n int32) *setWrapper {
	w.Spec.Replicas = ptr.To(n)
	w.Generation++
	return w
}

func (w *setWrapper) created(t metav1.Time) *setWrapper { w.CreationTimestamp = t; return w }

func (w *setWrapper) deleting() *setWrapper {
	w.DeletionTimestamp = ptr.To(metav1.Now())
	w.Finalizers = []string{metav1.FinalizerOrphanDependents}
	return w
}

// addrs returns the JSON list of the addresses of n tasks named <name>-<i> under service svc.
func addrs(ns, name, svc string, n int, port int) string {
	s := ""
	for i := range n {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(`"%s-%d.%s.%s.svc:%d"`, name, i, svc, ns, port)
	}
	return "[" + s + "]"
}

// workers returns the worker list of an N-task Job named job with subdomain job in namespace ns.
func workers(ns, job string, n int, port int) string { return addrs(ns, job, job, n, port) }

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
