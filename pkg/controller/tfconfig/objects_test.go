package tfconfig

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The apply configuration is the whole Secret the controller wants, and nothing else: what it leaves
// out (the type) it never contests; what it holds it owns and takes back on release.
func TestSecretApplyConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    workload
		want string
	}{
		{"Job", jobWorkload{makeJob("ns", "mnist", 2).Obj()},
			`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"mnist-tf-config","namespace":"ns","labels":{"muster.dev/tf-config-job":"mnist"},` +
				`"ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":"mnist","uid":"uid-ns-mnist","controller":true,"blockOwnerDeletion":false}]},` +
				`"data":{"cluster":"eyJ3b3JrZXIiOltdfQ=="}}`},
		{"StatefulSet in a group", statefulSetWorkload{makeSet("ns", "ps", 2).Label(GroupLabel, "g").Obj()},
			`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"ps-tf-config","namespace":"ns","labels":{"muster.dev/tf-config-job":"ps","muster.dev/tf-group":"g"},` +
				`"ownerReferences":[{"apiVersion":"apps/v1","kind":"StatefulSet","name":"ps","uid":"uid-sts-ns-ps","controller":true,"blockOwnerDeletion":false}]},` +
				`"data":{"cluster":"eyJ3b3JrZXIiOltdfQ=="}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(secretApply(tc.w, []byte(`{"worker":[]}`)))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("apply configuration\n got %s\nwant %s", got, tc.want)
			}
		})
	}

	got, err := json.Marshal(secretRelease("ns", "mnist-tf-config", "uid-users"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kind":"Secret","apiVersion":"v1","metadata":{"name":"mnist-tf-config","namespace":"ns","uid":"uid-users"}}`; string(got) != want {
		t.Errorf("release configuration\n got %s\nwant %s", got, want)
	}
}

func TestForeignSecret(t *testing.T) {
	w := jobWorkload{makeJob("ns", "mnist", 2).Obj()}
	entry := func(manager string, op metav1.ManagedFieldsOperationType, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
	}
	const ours = `{"f:data":{"f:cluster":{}},"f:metadata":{"f:labels":{"f:muster.dev/tf-config-job":{}},"f:ownerReferences":{"k:{\"uid\":\"uid-ns-mnist\"}":{}}}}`
	secret := func(data []string, entries ...metav1.ManagedFieldsEntry) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mnist-tf-config", Namespace: "ns",
			OwnerReferences: []metav1.OwnerReference{controllerRef(w)}, ManagedFields: entries}, Data: map[string][]byte{}}
		for _, k := range data {
			s.Data[k] = []byte("x")
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		secret *corev1.Secret
		want   string // "" for the controller's own
	}{
		{"applied by the controller alone", secret([]string{ClusterKey}, entry(FieldManager, metav1.ManagedFieldsOperationApply, ours)), ""},
		{"labelled and annotated by others", secret([]string{ClusterKey}, entry(FieldManager, metav1.ManagedFieldsOperationApply, ours),
			entry("kubectl-label", metav1.ManagedFieldsOperationUpdate, `{"f:metadata":{"f:labels":{"f:team":{}},"f:annotations":{"f:note":{}}}}`)), ""},
		{"written by update under the controller's name", secret([]string{ClusterKey}, entry(FieldManager, metav1.ManagedFieldsOperationUpdate, `{"f:data":{"f:cluster":{}},"f:type":{}}`)), ""},
		{"another key", secret([]string{ClusterKey, "password"}, entry(FieldManager, metav1.ManagedFieldsOperationApply, ours)), `holds the key "password"`},
		{"data of another writer", secret([]string{ClusterKey}, entry(FieldManager, metav1.ManagedFieldsOperationApply, ours),
			entry("kubectl-create", metav1.ManagedFieldsOperationUpdate, `{"f:data":{"f:cluster":{}}}`)), `"kubectl-create" wrote its data`},
		{"type of another writer", secret([]string{ClusterKey}, entry(FieldManager, metav1.ManagedFieldsOperationApply, ours),
			entry("kubectl-create", metav1.ManagedFieldsOperationUpdate, `{"f:type":{}}`)), `"kubectl-create" wrote its type`},
		{"made immutable by another writer", secret([]string{ClusterKey}, entry("kubectl-patch", metav1.ManagedFieldsOperationUpdate, `{"f:immutable":{}}`)), `"kubectl-patch" wrote its immutable`},
		{"fields from before the first apply", secret([]string{ClusterKey}, entry("before-first-apply", metav1.ManagedFieldsOperationUpdate, `{"f:data":{"f:cluster":{}}}`)), `"before-first-apply" wrote its data`},
		{"unreadable record", secret([]string{ClusterKey}, entry("x", metav1.ManagedFieldsOperationUpdate, `{`)), "cannot be read"},
		{"not controlled by the Job", func() *corev1.Secret {
			s := secret([]string{ClusterKey})
			s.OwnerReferences = nil
			return s
		}(), "not controlled by Job mnist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := foreignSecret(tc.secret, w)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("foreignSecret = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestConflictsOnlyWithItself(t *testing.T) {
	conflict := func(messages ...string) error {
		var causes []metav1.StatusCause
		for _, m := range messages {
			causes = append(causes, metav1.StatusCause{Type: metav1.CauseTypeFieldManagerConflict, Message: m, Field: ".data.cluster"})
		}
		return apierrors.NewApplyConflict(causes, "Apply failed")
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"the controller's earlier update", conflict(`conflict with "muster-tfconfig-controller" using v1`), true},
		{"the controller's earlier update, timed", conflict(`conflict with "muster-tfconfig-controller" using v1 at 2026-01-01T00:00:00Z`, `conflict with "muster-tfconfig-controller" using v1`), true},
		{"someone else", conflict(`conflict with "kubectl-create" using v1`), false},
		{"the controller and someone else", conflict(`conflict with "muster-tfconfig-controller" using v1`, `conflict with "kubectl-edit" using v1`), false},
		{"a name that only starts like the controller's", conflict(`conflict with "muster-tfconfig-controller-x" using v1`), false},
		{"no causes", apierrors.NewApplyConflict(nil, "Apply failed"), false},
		{"not a conflict", apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "x"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := conflictsOnlyWithItself(tc.err); got != tc.want {
				t.Errorf("conflictsOnlyWithItself(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
