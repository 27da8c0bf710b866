package tfconfig

import (
	"bytes"
	"fmt"
	"maps"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

var jobKind = batchv1.SchemeGroupVersion.WithKind("Job")

// controllerRef points at the Job. blockOwnerDeletion stays false: setting it needs update on
// jobs/finalizers wherever OwnerReferencesPermissionEnforcement is on, and the controller deletes
// what it owns itself when the Job goes.
func controllerRef(job *batchv1.Job) metav1.OwnerReference {
	ref := metav1.NewControllerRef(job, jobKind)
	ref.BlockOwnerDeletion = ptr.To(false)
	return *ref
}

// ownedLabels are the labels of everything the controller creates for job.
func ownedLabels(job *batchv1.Job) map[string]string {
	l := map[string]string{JobLabel: job.Name}
	if g := groupOf(job); g != "" {
		l[GroupLabel] = g
	}
	return l
}

func desiredSecret(job *batchv1.Job, cluster []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:            SecretName(job.Name),
			Namespace:       job.Namespace,
			Labels:          ownedLabels(job),
			OwnerReferences: []metav1.OwnerReference{controllerRef(job)},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{ClusterKey: bytes.Clone(cluster)},
	}
}

// podSelector selects the Job's pods: the API server puts this label on every Job's pod template.
func podSelector(job *batchv1.Job) map[string]string {
	return map[string]string{batchv1.JobNameLabel: job.Name}
}

func desiredService(job *batchv1.Job, ts TaskSet) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:            ts.Subdomain,
			Namespace:       job.Namespace,
			Labels:          ownedLabels(job),
			OwnerReferences: []metav1.OwnerReference{controllerRef(job)},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			// Peers must resolve each other before they are Ready: TensorFlow connects at start-up.
			PublishNotReadyAddresses: true,
			Selector:                 podSelector(job),
			Ports:                    desiredPorts(ts.Port),
		},
	}
}

func desiredPorts(port int32) []corev1.ServicePort {
	return []corev1.ServicePort{{
		Name:       PortName,
		Protocol:   corev1.ProtocolTCP,
		Port:       port,
		TargetPort: intstr.FromInt32(port),
	}}
}

// belongsTo reports whether obj is the controller's object for job: controlled by it, or labelled for
// a Job of its name and controlled by no one else (a Job of the same name deleted earlier, whose
// owner reference the garbage collector may have stripped). Anything else is never modified.
func belongsTo(obj metav1.Object, job *batchv1.Job) bool {
	return metav1.IsControlledBy(obj, job) || labelledFor(obj, job.Name)
}

// labelledFor reports whether obj carries the controller's label for jobName and has no controller
// other than a Job of that name.
func labelledFor(obj metav1.Object, jobName string) bool {
	if obj.GetLabels()[JobLabel] != jobName {
		return false
	}
	ref := metav1.GetControllerOf(obj)
	return ref == nil || isJobRef(ref, jobName)
}

func isJobRef(ref *metav1.OwnerReference, name string) bool {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == batchv1.GroupName && ref.Kind == jobKind.Kind && ref.Name == name
}

// metaUpToDate reports whether obj already has the labels and controller reference it should have.
func metaUpToDate(obj metav1.Object, job *batchv1.Job) bool {
	if !metav1.IsControlledBy(obj, job) {
		return false
	}
	l := obj.GetLabels()
	for k, v := range ownedLabels(job) {
		if l[k] != v {
			return false
		}
	}
	_, hasGroup := l[GroupLabel]
	return hasGroup == (groupOf(job) != "")
}

// claim sets obj's labels and controller reference for job, keeping unrelated labels and owners.
func claim(obj metav1.Object, job *batchv1.Job) {
	l := maps.Clone(obj.GetLabels())
	if l == nil {
		l = map[string]string{}
	}
	delete(l, GroupLabel)
	maps.Copy(l, ownedLabels(job))
	obj.SetLabels(l)

	var refs []metav1.OwnerReference
	for _, r := range obj.GetOwnerReferences() {
		// Drop the reference of an earlier Job of the same name; a controller reference can only be a
		// Job of this name here (belongsTo).
		if isJobRef(&r, job.Name) || (r.Controller != nil && *r.Controller) {
			continue
		}
		refs = append(refs, r)
	}
	obj.SetOwnerReferences(append(refs, controllerRef(job)))
}

func secretUpToDate(s *corev1.Secret, job *batchv1.Job, cluster []byte) bool {
	return metaUpToDate(s, job) && len(s.Data) == 1 && bytes.Equal(s.Data[ClusterKey], cluster)
}

func serviceUpToDate(svc *corev1.Service, job *batchv1.Job, ts TaskSet) bool {
	if !metaUpToDate(svc, job) || !svc.Spec.PublishNotReadyAddresses || !maps.Equal(svc.Spec.Selector, podSelector(job)) {
		return false
	}
	want := desiredPorts(ts.Port)
	if len(svc.Spec.Ports) != len(want) {
		return false
	}
	for i := range want {
		got := svc.Spec.Ports[i]
		if got.Name != want[i].Name || got.Protocol != want[i].Protocol || got.Port != want[i].Port || got.TargetPort != want[i].TargetPort {
			return false
		}
	}
	return true
}

// serviceServes checks whether a Service the controller does not own still gives job's pods their
// DNS names: it must be headless and select them. It returns what is wrong otherwise.
func serviceServes(svc *corev1.Service, job *batchv1.Job) (bool, string) {
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return false, "it is not headless (spec.clusterIP is not None)"
	}
	if len(svc.Spec.Selector) == 0 {
		return false, "it has no selector"
	}
	podLabels := maps.Clone(job.Spec.Template.Labels)
	if podLabels == nil {
		podLabels = map[string]string{}
	}
	maps.Copy(podLabels, podSelector(job))
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(podLabels)) {
		return false, fmt.Sprintf("its selector %v does not select the Job's pods", labels.Set(svc.Spec.Selector))
	}
	return true, ""
}
