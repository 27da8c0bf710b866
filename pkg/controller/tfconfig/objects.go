package tfconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	applymetav1 "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/gang"
)

// controllerRef points at the workload. blockOwnerDeletion stays false: setting it needs update on
// jobs/finalizers or statefulsets/finalizers wherever OwnerReferencesPermissionEnforcement is on, and
// the controller deletes what it owns itself when the workload goes.
func controllerRef(w workload) metav1.OwnerReference {
	ref := metav1.NewControllerRef(w, w.kind().GroupVersionKind())
	ref.BlockOwnerDeletion = ptr.To(false)
	return *ref
}

// ownedLabels are the labels of everything the controller creates for w.
func ownedLabels(w workload) map[string]string {
	l := map[string]string{JobLabel: w.GetName()}
	if g := groupOf(w); g != "" {
		l[GroupLabel] = g
	}
	return l
}

// secretApply is the whole Secret the controller wants for w, as a server-side apply configuration:
// applied again, the API server removes whatever of it is no longer wanted (a label, the owner
// reference of an earlier workload of the same name). The type is left out, so that it is defaulted to
// Opaque on creation and never contested.
func secretApply(w workload, cluster []byte) *applycorev1.SecretApplyConfiguration {
	ref := controllerRef(w)
	return applycorev1.Secret(SecretName(w.GetName()), w.GetNamespace()).
		WithLabels(ownedLabels(w)).
		WithOwnerReferences(applymetav1.OwnerReference().
			WithAPIVersion(ref.APIVersion).
			WithKind(ref.Kind).
			WithName(ref.Name).
			WithUID(ref.UID).
			WithController(true).
			WithBlockOwnerDeletion(false)).
		WithData(map[string][]byte{ClusterKey: bytes.Clone(cluster)})
}

// secretRelease gives back every field of the Secret name the controller applied: applied, the API
// server removes the fields no other field manager owns, which undoes an apply that merged into
// someone else's Secret. The UID is that Secret's: an apply of it never creates a Secret (the API
// server refuses to create an object with a given UID), so a Secret deleted since it was read is not
// made again, empty, under the workload's Secret name.
func secretRelease(namespace, name string, uid types.UID) *applycorev1.SecretApplyConfiguration {
	return applycorev1.Secret(name, namespace).WithUID(uid)
}

// contentFields are the fields of a Secret that say whose it is: another writer of any of them makes
// the Secret foreign. Labels, annotations and finalizers others add do not.
var contentFields = []string{"f:data", "f:stringData", "f:type", "f:immutable"}

// foreignSecret says why a Secret returned by the controller's apply is not w's own, or returns "" when
// it is. The apply merges into whatever Secret has that name, so this is how the controller tells a
// Secret it made (controlled by w, holding only the cluster key, its content written by no one else)
// from one it has just merged into. A Secret without any record of its writers is foreign too: the API
// server records its fields under the manager "before-first-apply" at the first apply.
func foreignSecret(s *corev1.Secret, w workload) string {
	if !metav1.IsControlledBy(s, w) {
		return fmt.Sprintf("it is not controlled by %s %s", w.kind(), w.GetName())
	}
	for _, k := range slices.Sorted(maps.Keys(s.Data)) {
		if k != ClusterKey {
			return fmt.Sprintf("it holds the key %q", k)
		}
	}
	for _, e := range s.ManagedFields {
		if e.Manager == FieldManager || e.FieldsV1 == nil {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(e.FieldsV1.Raw, &fields); err != nil {
			return fmt.Sprintf("the record of its writers cannot be read (%v)", err)
		}
		for _, f := range contentFields {
			if _, ok := fields[f]; ok {
				return fmt.Sprintf("%q wrote its %s", e.Manager, strings.TrimPrefix(f, "f:"))
			}
		}
	}
	return ""
}

// conflictsOnlyWithItself reports whether an apply conflict is only with fields written under the
// controller's own name by update, as versions before server-side apply wrote their Secrets. Those are
// the controller's to take over.
func conflictsOnlyWithItself(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsConflict(err) || !errors.As(err, &status) {
		return false
	}
	details := status.Status().Details
	if details == nil || len(details.Causes) == 0 {
		return false
	}
	// The API server names the other manager first: `conflict with "name" using v1 …`.
	self := fmt.Sprintf("conflict with %q", FieldManager)
	for _, c := range details.Causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict || (c.Message != self && !strings.HasPrefix(c.Message, self+" ")) {
			return false
		}
	}
	return true
}

func desiredService(w workload, ts TaskSet) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:            ts.Subdomain,
			Namespace:       w.GetNamespace(),
			Labels:          ownedLabels(w),
			OwnerReferences: []metav1.OwnerReference{controllerRef(w)},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			// Peers must resolve each other before they are Ready: TensorFlow connects at start-up.
			PublishNotReadyAddresses: true,
			Selector:                 w.podSelector(),
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

// labelledFor reports whether obj carries the controller's label for the workload of key and has no
// controller other than a workload of that kind and name (the workload itself, or one of the same name
// deleted earlier; the garbage collector may have stripped its owner reference). This is what makes a
// Service the controller's: the label, which the shipped admission policy requires of every Service
// the controller creates, updates or deletes. A Service without it is never modified, even one the
// workload controls.
func labelledFor(obj metav1.Object, key gang.Key) bool {
	if obj.GetLabels()[JobLabel] != key.Name {
		return false
	}
	ref := metav1.GetControllerOf(obj)
	return ref == nil || refersTo(ref, key)
}

func refersTo(ref *metav1.OwnerReference, key gang.Key) bool {
	kind, ok := gang.OwnerKind(ref.APIVersion, ref.Kind)
	return ok && kind == key.Kind && ref.Name == key.Name
}

// metaUpToDate reports whether obj already has the labels and controller reference it should have.
func metaUpToDate(obj metav1.Object, w workload) bool {
	if !metav1.IsControlledBy(obj, w) {
		return false
	}
	l := obj.GetLabels()
	for k, v := range ownedLabels(w) {
		if l[k] != v {
			return false
		}
	}
	_, hasGroup := l[GroupLabel]
	return hasGroup == (groupOf(w) != "")
}

// claim sets obj's labels and controller reference for w, keeping unrelated labels and owners.
func claim(obj metav1.Object, w workload) {
	l := maps.Clone(obj.GetLabels())
	if l == nil {
		l = map[string]string{}
	}
	delete(l, GroupLabel)
	maps.Copy(l, ownedLabels(w))
	obj.SetLabels(l)

	var refs []metav1.OwnerReference
	for _, r := range obj.GetOwnerReferences() {
		// Drop the reference of an earlier workload of the same name; a controller reference can only
		// be one of those here (labelledFor).
		if refersTo(&r, keyOf(w)) || (r.Controller != nil && *r.Controller) {
			continue
		}
		refs = append(refs, r)
	}
	obj.SetOwnerReferences(append(refs, controllerRef(w)))
}

func serviceUpToDate(svc *corev1.Service, w workload, ts TaskSet) bool {
	if !metaUpToDate(svc, w) || !svc.Spec.PublishNotReadyAddresses || !maps.Equal(svc.Spec.Selector, w.podSelector()) ||
		len(svc.Spec.ExternalIPs) != 0 {
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

// serviceServes checks whether a Service the controller does not own still gives w's pods their DNS
// names: it must be headless and select them. It returns what is wrong otherwise.
func serviceServes(svc *corev1.Service, w workload) (bool, string) {
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return false, "it is not headless (spec.clusterIP is not None)"
	}
	if len(svc.Spec.Selector) == 0 {
		return false, "it has no selector"
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.podLabels())) {
		return false, fmt.Sprintf("its selector %v does not select the %s's pods", labels.Set(svc.Spec.Selector), w.kind())
	}
	return true, ""
}
