package tfconfig

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestControllerManifests checks the shipped Deployment and RBAC against what the controller does:
// the restricted Pod Security profile, probes on the health port, and exactly the permissions used.
func TestControllerManifests(t *testing.T) {
	dir := "../../../manifests/controller"
	var deploy *appsv1.Deployment
	var clusterRole *rbacv1.ClusterRole
	var leaseRole *rbacv1.Role
	for _, file := range []string{"serviceaccount.yaml", "rbac.yaml", "deployment.yaml"} {
		for _, obj := range loadManifest(t, filepath.Join(dir, file)) {
			switch o := obj.(type) {
			case *appsv1.Deployment:
				deploy = o
			case *rbacv1.ClusterRole:
				clusterRole = o
			case *rbacv1.Role:
				leaseRole = o
			}
		}
	}
	if deploy == nil || clusterRole == nil || leaseRole == nil {
		t.Fatalf("want a Deployment, a ClusterRole and a Role in %s", dir)
	}

	if deploy.Namespace != "muster-system" {
		t.Errorf("Deployment namespace = %q, want muster-system", deploy.Namespace)
	}
	pod := deploy.Spec.Template.Spec
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot and seccomp RuntimeDefault", psc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != "ghcr.io/muster-sched/tfconfig-controller:latest" {
		t.Errorf("image = %s", c.Image)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container securityContext = %+v, want no privilege escalation, read-only root, all capabilities dropped", sc)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "health" {
			t.Errorf("%s probe = %+v, want an HTTP probe on the health port", name, p)
		}
	}
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		t.Errorf("no CPU request")
	}
	if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
		t.Errorf("no memory request")
	}

	// Permissions: group/resource → verbs, exactly.
	want := map[string][]string{
		"batch/jobs":        {"get", "list", "watch"},
		"apps/statefulsets": {"get", "list", "watch"},
		"/secrets":          {"create", "patch", "delete"}, // server-side apply and delete by name: never read
		"/services":         {"get", "list", "watch", "create", "update", "delete"},
		"/events":           {"create", "patch"},
	}
	got := map[string][]string{}
	for _, r := range clusterRole.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got[g+"/"+res] = append(got[g+"/"+res], r.Verbs...)
			}
		}
	}
	for k, verbs := range want {
		if !slices.Equal(got[k], verbs) {
			t.Errorf("ClusterRole %s verbs = %v, want %v", k, got[k], verbs)
		}
	}
	if len(got) != len(want) {
		t.Errorf("ClusterRole grants %v, want only %v", got, want)
	}
	if leaseRole.Namespace != "muster-system" {
		t.Errorf("lease Role namespace = %q", leaseRole.Namespace)
	}
	for _, r := range leaseRole.Rules {
		if !slices.Equal(r.APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(r.Resources, []string{"leases"}) {
			t.Errorf("lease Role rule %+v grants more than leases", r)
		}
		if len(r.ResourceNames) > 0 && !slices.Equal(r.ResourceNames, []string{ControllerName}) {
			t.Errorf("lease Role names %v, want %s", r.ResourceNames, ControllerName)
		}
	}
}

// TestControllerAdmissionPolicies checks that the shipped admission policies cover what RBAC cannot
// narrow, for the controller's ServiceAccount only, and are bound to deny: writes to Secrets by name,
// and writes to Services by the label the controller puts on its own (JobLabel). TestLeastPrivilege
// shows on a real API server that they deny what they should and let the controller work.
func TestControllerAdmissionPolicies(t *testing.T) {
	policies := map[string]*admissionregistrationv1.ValidatingAdmissionPolicy{}
	bindings := map[string]*admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	for _, obj := range loadManifest(t, "../../../manifests/controller/admission-policy.yaml") {
		switch o := obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			policies[o.Name] = o
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			bindings[o.Spec.PolicyName] = o
		}
	}
	user := "system:serviceaccount:muster-system:" + ControllerName
	for resource, mention := range map[string]string{"secrets": SecretSuffix, "services": JobLabel} {
		var policy *admissionregistrationv1.ValidatingAdmissionPolicy
		for _, p := range policies {
			if rules := p.Spec.MatchConstraints.ResourceRules; len(rules) == 1 && slices.Equal(rules[0].Resources, []string{resource}) {
				policy = p
			}
		}
		if policy == nil {
			t.Errorf("no admission policy for %s alone", resource)
			continue
		}
		ops := policy.Spec.MatchConstraints.ResourceRules[0].Operations
		for _, op := range []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete} {
			if !slices.Contains(ops, op) {
				t.Errorf("policy %s does not match %s", policy.Name, op)
			}
		}
		if fp := policy.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
			t.Errorf("policy %s failurePolicy = %v, want Fail", policy.Name, fp)
		}
		if c := policy.Spec.MatchConditions; len(c) != 1 || !strings.Contains(c[0].Expression, "'"+user+"'") {
			t.Errorf("policy %s match conditions = %+v, want the controller's ServiceAccount %s only", policy.Name, c, user)
		}
		var mentioned bool
		for _, v := range policy.Spec.Validations {
			mentioned = mentioned || strings.Contains(v.Expression, mention)
		}
		if !mentioned {
			t.Errorf("policy %s has no validation on %q", policy.Name, mention)
		}
		if b := bindings[policy.Name]; b == nil || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
			t.Errorf("policy %s binding = %+v, want one that denies", policy.Name, b)
		}
	}
}
