//go:build e2e

package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/test/e2e/tools"
)

// What Kueue v0.17.0 expects of a cluster, read from its source
// (cmd/kueue/main.go, apis/config/v1beta2).
const (
	// Kueue's namespace (config `namespace`).
	kueueNamespace = "kueue-system"
	// With internal certificate management off, the metrics server reads
	// its certificate from here. Hard-coded, no setting.
	kueueMetricsCertDir = "/etc/kueue/metrics/certs"
	// The CRDs in the module's source.
	kueueCRDGlob = "config/components/crd/bases/*.yaml"
	// Job label that hands the Job to a LocalQueue.
	kueueQueueLabel = "kueue.x-k8s.io/queue-name"
	// The capacity-type label muster also reads to tell spot nodes.
	capacityTypeLabel = "karpenter.sh/capacity-type"
)

func kueueResource(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: resource}
}

var (
	resourceFlavors = kueueResource("resourceflavors")
	clusterQueues   = kueueResource("clusterqueues")
	localQueues     = kueueResource("localqueues")
	workloads       = kueueResource("workloads")
)

// kueueConfig runs Kueue outside a cluster: no leader election, only the
// batch/job integration, its webhook server on a loopback port with a
// certificate of the test, metrics and health probes off, certificates
// managed by the test, no visibility API server (it would need an
// APIService).
const kueueConfig = `apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: ` + kueueNamespace + `
leaderElection:
  leaderElect: false
health:
  healthProbeBindAddress: "0"
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
internalCertManagement:
  enable: false
integrations:
  frameworks: ["batch/job"]
featureGates:
  VisibilityOnDemand: false
`

// startKueue installs Kueue's CRDs from its source and runs its controller
// manager against the control plane.
func (c *e2eCluster) startKueue() *toolProcess {
	c.t.Helper()
	binary, source := toolBinary(c.t, tools.Kueue)
	crds, err := filepath.Glob(filepath.Join(source, kueueCRDGlob))
	if err != nil || len(crds) == 0 {
		c.t.Fatalf("no CRDs at %s in Kueue's source (%v)", kueueCRDGlob, err)
	}
	if err := c.InstallCRDFiles(crds...); err != nil {
		c.t.Fatalf("installing Kueue's CRDs: %v", err)
	}
	c.createNamespace(kueueNamespace)

	dir := c.t.TempDir()
	webhookCerts := filepath.Join(dir, "webhook-certs")
	selfSignedCert(c.t, webhookCerts)
	metricsCert, metricsKey := selfSignedCert(c.t, filepath.Join(dir, "metrics-certs"))
	provideFiles(c.t, kueueMetricsCertDir, map[string][]byte{"tls.crt": metricsCert, "tls.key": metricsKey})
	config := filepath.Join(dir, "kueue-config.yaml")
	writeFiles(c.t, dir, map[string][]byte{"kueue-config.yaml": fmt.Appendf(nil, kueueConfig, freePort(c.t), webhookCerts)})

	// Ready when it reports a ClusterQueue active (createQueues waits).
	return c.startTool("kueue", binary, []string{"KUBECONFIG=" + c.Kubeconfig}, "--config="+config)
}

// kueueFlavor is a ResourceFlavor with its GPU quota in the ClusterQueue.
type kueueFlavor struct {
	name       string
	nodeLabels map[string]string
	toleration *corev1.Toleration
	gpus       int
}

// createQueues creates the flavors, a ClusterQueue "gpu" that takes them in
// order (GPU quota each, CPU plenty) and a LocalQueue "team" in the test
// namespace, and waits until Kueue reports the ClusterQueue active.
func (c *e2eCluster) createQueues(flavors ...kueueFlavor) {
	c.t.Helper()
	var quotas strings.Builder
	for _, f := range flavors {
		spec := map[string]any{}
		if len(f.nodeLabels) > 0 {
			spec["nodeLabels"] = f.nodeLabels
		}
		if f.toleration != nil {
			spec["tolerations"] = []corev1.Toleration{*f.toleration}
		}
		c.createObject(resourceFlavors, false, map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
			"metadata": map[string]any{"name": f.name},
			"spec":     spec,
		})
		fmt.Fprintf(&quotas, `
    - name: %s
      resources:
      - {name: cpu, nominalQuota: 100}
      - {name: nvidia.com/gpu, nominalQuota: %d}`, f.name, f.gpus)
	}
	c.create(clusterQueues, false, `
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: gpu
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, nvidia.com/gpu]
    flavors:`+quotas.String()+`
`)
	c.create(localQueues, true, `
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: team
spec:
  clusterQueue: gpu
`)
	c.waitFor("ClusterQueue gpu active", 60*time.Second, func() (bool, error) {
		cq, err := c.dyn.Resource(clusterQueues).Get(c.ctx, "gpu", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return conditionTrue(cq, "Active"), nil
	})
}

// createObject creates an object built as a map (for fields easier to build
// than to write as YAML).
func (c *e2eCluster) createObject(resource schema.GroupVersionResource, namespaced bool, obj map[string]any) {
	c.t.Helper()
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&obj)
	if err != nil {
		c.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: content}
	client := c.dyn.Resource(resource)
	if namespaced {
		u.SetNamespace(c.ns)
		_, err = client.Namespace(c.ns).Create(c.ctx, u, metav1.CreateOptions{})
	} else {
		_, err = client.Create(c.ctx, u, metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatalf("creating %s %s: %v", resource.Resource, u.GetName(), err)
	}
}

// createQueuedJob creates an Indexed Job of workers × 1 GPU for muster,
// suspended and labelled for LocalQueue "team", as Kueue's users submit
// them (Kueue's webhook, which would suspend it, is not called here).
func (c *e2eCluster) createQueuedJob(name string, workers int32) {
	c.createJob(jobSpec{name: name, workers: workers, gpus: 1, labels: map[string]string{kueueQueueLabel: "team"},
		mutate: func(job *batchv1.Job) {
			job.Spec.Suspend = ptr.To(true)
			// No kubelet confirms that a deleted pod stopped.
			job.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
		}})
}

// workloadOf returns the Workload Kueue created for the Job, or nil.
func (c *e2eCluster) workloadOf(job string) *unstructured.Unstructured {
	c.t.Helper()
	list, err := c.dyn.Resource(workloads).Namespace(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	for i := range list.Items {
		for _, owner := range list.Items[i].GetOwnerReferences() {
			if owner.Kind == "Job" && owner.Name == job {
				return &list.Items[i]
			}
		}
	}
	return nil
}

// waitPending waits until Kueue says the Job's Workload does not fit the
// quota, and checks that the Job is still suspended and has no pods.
func (c *e2eCluster) waitPending(job string) {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			c.logKueueState(job)
		}
	}()
	c.waitFor("Workload of Job "+job+" pending for quota", 60*time.Second, func() (bool, error) {
		wl := c.workloadOf(job)
		if wl == nil {
			return false, nil
		}
		cond := findCondition(wl, "QuotaReserved")
		return cond != nil && cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, "insufficient"), nil
	})
	got, err := c.Client.BatchV1().Jobs(c.ns).Get(c.ctx, job, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	if !ptr.Deref(got.Spec.Suspend, false) || len(c.jobPods(job)) != 0 {
		c.t.Errorf("Job %s over quota: suspend %v, %d pods; want suspended, none", job, ptr.Deref(got.Spec.Suspend, false), len(c.jobPods(job)))
	}
}

// waitAdmittedAndBound waits until Kueue admits the Job and muster binds
// all its pods; it returns the pods and the Workload's flavor for GPUs.
func (c *e2eCluster) waitAdmittedAndBound(job string, workers int) ([]corev1.Pod, string) {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			c.logKueueState(job)
		}
	}()
	pods := c.waitPodsBound("Job "+job, batchv1.JobNameLabel, job, workers, 90*time.Second)
	wl := c.workloadOf(job)
	if wl == nil || !conditionTrue(wl, "Admitted") {
		c.t.Fatalf("Job %s runs but its Workload is not admitted", job)
	}
	var flavor string
	assignments, _, _ := unstructured.NestedSlice(wl.Object, "status", "admission", "podSetAssignments")
	if len(assignments) == 1 {
		flavor, _, _ = unstructured.NestedString(assignments[0].(map[string]any), "flavors", configv1.DefaultGPUResourceName)
	}
	return pods, flavor
}

// logKueueState says whether Kueue suspended or admitted the Job, and why.
func (c *e2eCluster) logKueueState(job string) {
	got, err := c.Client.BatchV1().Jobs(c.ns).Get(c.ctx, job, metav1.GetOptions{})
	if err != nil {
		c.t.Logf("Job %s: %v", job, err)
		return
	}
	c.t.Logf("Job %s: suspend %v, nodeSelector %v", job, ptr.Deref(got.Spec.Suspend, false), got.Spec.Template.Spec.NodeSelector)
	wl := c.workloadOf(job)
	if wl == nil {
		c.t.Logf("Job %s: no Workload (Kueue has not seen it)", job)
		return
	}
	for _, t := range []string{"QuotaReserved", "Admitted", "Finished", "Evicted"} {
		if cond := findCondition(wl, t); cond != nil {
			c.t.Logf("Workload %s: %s=%s %s: %s", wl.GetName(), t, cond.Status, cond.Reason, cond.Message)
		}
	}
}

func findCondition(obj *unstructured.Unstructured, conditionType string) *metav1.Condition {
	raw, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	var conditions []metav1.Condition
	for _, r := range raw {
		var cond metav1.Condition
		if m, ok := r.(map[string]any); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(m, &cond) == nil {
			conditions = append(conditions, cond)
		}
	}
	return meta.FindStatusCondition(conditions, conditionType)
}

func conditionTrue(obj *unstructured.Unstructured, conditionType string) bool {
	cond := findCondition(obj, conditionType)
	return cond != nil && cond.Status == metav1.ConditionTrue
}

// A GPU quota of 4 on 8 free GPUs: Kueue admits one 4-GPU Job at a time and
// muster places each admitted Job whole. The second waits suspended until
// the first finishes (its pods succeed); the third waits until the second
// is deleted (the garbage collector deletes its Workload). No Job is ever
// partly bound.
func TestE2EKueueGPUQuota(t *testing.T) {
	c := startE2ECluster(t, gpuNodes(4, 2)...)
	c.startKueue()
	c.createQueues(kueueFlavor{name: "default-flavor", gpus: 4})
	gangs := c.observeGangs(map[string]int{"first": 4, "second": 4, "third": 4})

	c.createQueuedJob("first", 4)
	c.waitAdmittedAndBound("first", 4)
	c.createQueuedJob("second", 4)
	c.waitPending("second")

	// The first finishes: the kubelet would report its pods Succeeded.
	for _, p := range c.jobPods("first") {
		c.setPhase(p, corev1.PodSucceeded)
	}
	c.waitAdmittedAndBound("second", 4)

	c.createQueuedJob("third", 4)
	c.waitPending("third")
	err := c.Client.BatchV1().Jobs(c.ns).Delete(c.ctx, "second", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil {
		t.Fatal(err)
	}
	c.waitAdmittedAndBound("third", 4)
	gangs.check(t, 5*time.Second)
}

// Spot overflow: a ClusterQueue takes GPUs from an on-demand flavor first,
// then from a spot flavor whose nodeLabels and tolerations Kueue injects
// into the admitted Job. muster honours them: the overflow Job lands on the
// tainted spot nodes only, although two on-demand GPUs are still free and
// muster's default policy (avoid) would otherwise use them first.
func TestE2EKueueSpotFlavor(t *testing.T) {
	spotTaint := corev1.Taint{Key: "e2e.muster.dev/spot", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	nodes := []*corev1.Node{
		gpuNode("on-demand-1", 2).Label(capacityTypeLabel, "on-demand").Obj(),
		gpuNode("on-demand-2", 2).Label(capacityTypeLabel, "on-demand").Obj(),
		gpuNode("on-demand-3", 2).Label(capacityTypeLabel, "on-demand").Obj(),
		gpuNode("spot-1", 2).Label(capacityTypeLabel, "spot").Taint(spotTaint).Obj(),
		gpuNode("spot-2", 2).Label(capacityTypeLabel, "spot").Taint(spotTaint).Obj(),
	}
	c := startE2ECluster(t, nodes...)
	c.startKueue()
	c.createQueues(
		kueueFlavor{name: "on-demand", nodeLabels: map[string]string{capacityTypeLabel: "on-demand"}, gpus: 4},
		kueueFlavor{name: "spot", nodeLabels: map[string]string{capacityTypeLabel: "spot"}, gpus: 4,
			toleration: &corev1.Toleration{Key: spotTaint.Key, Operator: corev1.TolerationOpEqual, Value: spotTaint.Value, Effect: spotTaint.Effect}},
	)
	gangs := c.observeGangs(map[string]int{"steady": 4, "overflow": 4})

	c.createQueuedJob("steady", 4)
	steady, steadyFlavor := c.waitAdmittedAndBound("steady", 4)
	c.createQueuedJob("overflow", 4)
	overflow, overflowFlavor := c.waitAdmittedAndBound("overflow", 4)

	if steadyFlavor != "on-demand" || overflowFlavor != "spot" {
		t.Errorf("Kueue assigned flavors steady=%q overflow=%q, want on-demand and spot", steadyFlavor, overflowFlavor)
	}
	for _, p := range overflow {
		if p.Spec.NodeSelector[capacityTypeLabel] != "spot" {
			t.Errorf("pod %s: nodeSelector %v, want Kueue's %s=spot", p.Name, p.Spec.NodeSelector, capacityTypeLabel)
		}
	}
	for job, pods := range map[string][]corev1.Pod{"on-demand": steady, "spot": overflow} {
		for node := range nodesOf(pods) {
			if !strings.HasPrefix(node, job+"-") {
				t.Errorf("pods of the %s Job on node %s: %v", job, node, nodesOf(pods))
			}
		}
	}
	gangs.check(t, 5*time.Second)
}
