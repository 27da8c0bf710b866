package integration

import (
	"context"
	"io/fs"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/manifests"
)

// buildManifests runs kustomize on manifests/ the way kubectl apply -k does.
func buildManifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../../manifests")
	if err != nil {
		t.Fatalf("kustomize build manifests/: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// kubectl apply -k manifests/ against a real API server: every object is
// accepted, in dependency order.
func TestManifestsApplyCleanly(t *testing.T) {
	kinds := applyManifests(t, controlplane.Start(t))
	for _, kind := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "FlowSchema"} {
		if kinds[kind] == 0 {
			t.Errorf("manifests/ has no %s", kind)
		}
	}
}

// The examples users copy are accepted by the API server as written.
func TestExamplesApplyCleanly(t *testing.T) {
	cp := controlplane.Start(t)
	ns := cp.Namespace(t, "examples")
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	files, err := fs.Glob(manifests.FS, "examples/*.yaml")
	if err != nil || !slices.Contains(files, "examples/mnist-mwms.yaml") || !slices.Contains(files, "examples/mnist-mwms-statefulset.yaml") {
		t.Fatalf("examples: %v %v; want the Job and the StatefulSet example among them", files, err)
	}
	for _, f := range files {
		data, err := manifests.FS.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if _, err := dyn.Resource(mapping.Resource).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
				t.Errorf("%s: %s %s: %v", f, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
}

// applyManifests creates every object of manifests/ with strict field
// validation (CRDs that already exist are kept) and counts them by kind.
func applyManifests(t *testing.T, cp *controlplane.ControlPlane) map[string]int {
	t.Helper()
	ctx := context.Background()
	objs := buildManifests(t)
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	// The in-process API server has no kube-system namespace; a cluster does.
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rank := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "Namespace", "CustomResourceDefinition":
			return 0
		}
		return 1
	}
	kinds := map[string]int{}
	for pass := 0; pass < 2; pass++ {
		for _, o := range objs {
			if rank(o) != pass {
				continue
			}
			kinds[o.GetKind()]++
			gvk := o.GroupVersionKind()
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
			if ns := o.GetNamespace(); ns != "" {
				ri = dyn.Resource(mapping.Resource).Namespace(ns)
			}
			if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("applying %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
		mapper.Reset()
	}
	return kinds
}

func TestManifestsDeploymentsAreRestrictedAndConfigured(t *testing.T) {
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	configMaps := map[string]*corev1.ConfigMap{}
	var deployments []*appsv1.Deployment
	var roles []*rbacv1.ClusterRole
	var budgets []*policyv1.PodDisruptionBudget
	for _, o := range buildManifests(t) {
		switch o.GetKind() {
		case "PodDisruptionBudget":
			b := &policyv1.PodDisruptionBudget{}
			mustConvert(t, o, b)
			budgets = append(budgets, b)
		case "ConfigMap":
			cm := &corev1.ConfigMap{}
			mustConvert(t, o, cm)
			configMaps[cm.Name] = cm
		case "Deployment":
			d := &appsv1.Deployment{}
			mustConvert(t, o, d)
			deployments = append(deployments, d)
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			mustConvert(t, o, r)
			roles = append(roles, r)
		}
	}
	for _, d := range deployments {
		if d.Namespace != "muster-system" {
			t.Errorf("Deployment %s in namespace %q", d.Name, d.Namespace)
		}
		for _, r := range evaluator.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec) {
			if !r.Allowed {
				t.Errorf("Deployment %s violates the restricted Pod Security Standard: %s: %s", d.Name, r.ForbiddenReason, r.ForbiddenDetail)
			}
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.LivenessProbe == nil || c.ReadinessProbe == nil || c.Resources.Requests.Cpu().IsZero() {
				t.Errorf("Deployment %s container %s lacks probes or resource requests", d.Name, c.Name)
			}
		}
		if d.Name != "muster-scheduler" {
			continue
		}
		if *d.Spec.Replicas != 2 {
			t.Errorf("scheduler replicas = %d, want 2", *d.Spec.Replicas)
		}
		// The standby starts its informers only when it leads
		// (delayCacheUntilActive) and fails sched-handler-sync until then;
		// Ready must not wait for that, or a rollout stalls.
		if probe := d.Spec.Template.Spec.Containers[0].ReadinessProbe; probe == nil || probe.HTTPGet == nil ||
			!strings.Contains(probe.HTTPGet.Path, "exclude=sched-handler-sync") {
			t.Errorf("the scheduler's readiness probe %+v waits for sched-handler-sync, which a standby fails", probe)
		}
		if !strings.Contains(string(shipped), "\ndelayCacheUntilActive: true\n") {
			t.Errorf("the shipped configuration does not delay the standby's informers until it leads")
		}
		drainable := false
		for _, b := range budgets {
			selector, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
			if err == nil && b.Namespace == d.Namespace && selector.Matches(labels.Set(d.Spec.Template.Labels)) &&
				b.Spec.MaxUnavailable != nil && b.Spec.MaxUnavailable.IntValue() == 1 {
				drainable = true
			}
		}
		if !drainable {
			t.Errorf("no PodDisruptionBudget lets a drain take the scheduler's replicas one at a time")
		}
		var configMap string
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				configMap = v.ConfigMap.Name
			}
		}
		cm := configMaps[configMap]
		if cm == nil {
			t.Fatalf("scheduler Deployment mounts ConfigMap %q, which manifests/ does not create", configMap)
		}
		if cm.Data["scheduler-config.yaml"] != string(shipped) {
			t.Errorf("ConfigMap %s is not generated from manifests/scheduler/scheduler-config.yaml", cm.Name)
		}
	}
	// Least privilege: neither component may read Secrets (the controller
	// only applies and deletes its own), nor evict pods, nor use wildcards;
	// the scheduler deletes pods only for gang preemption, and the
	// controller never.
	for _, r := range roles {
		for _, rule := range r.Rules {
			for _, v := range append(append([]string{}, rule.Verbs...), rule.Resources...) {
				if v == "*" {
					t.Errorf("ClusterRole %s uses a wildcard: %+v", r.Name, rule)
				}
			}
			for _, res := range rule.Resources {
				if r.Name == "muster-scheduler" && (res == "secrets" || res == "pods/eviction") {
					t.Errorf("scheduler ClusterRole grants %v on %s", rule.Verbs, res)
				}
				if res == "secrets" && slices.ContainsFunc(rule.Verbs, func(v string) bool { return v == "get" || v == "list" || v == "watch" }) {
					t.Errorf("ClusterRole %s may read Secrets: %v", r.Name, rule.Verbs)
				}
				if r.Name != "muster-scheduler" && (res == "pods" || res == "pods/eviction") && strings.Contains(strings.Join(rule.Verbs, ","), "delete") {
					t.Errorf("ClusterRole %s may delete pods", r.Name)
				}
			}
		}
	}
}

func mustConvert(t *testing.T, u *unstructured.Unstructured, into interface{}) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		data, _ := yaml.Marshal(u.Object)
		t.Fatalf("decoding %s: %v\n%s", u.GetKind(), err, data)
	}
}
