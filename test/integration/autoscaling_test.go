package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	autoscalingv1 "k8s.io/autoscaler/cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/manifests"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
	"github.com/muster-sched/muster/pkg/plugins/mustergang"
)

// Gangs on an autoscaled cluster (docs/autoscaling.md): cluster-autoscaler's
// ProvisioningRequest CRD, from the module muster pins
// (k8s.io/autoscaler/cluster-autoscaler/apis), on the in-process API server,
// and a stand-in provisioner that answers requests with the API's
// documented conditions and adds the nodes it provisions. The autoscaler
// itself cannot be built here.

const autoscalerAPIs = "k8s.io/autoscaler/cluster-autoscaler/apis"

// provisioningArgs turns on ProvisioningRequests in MusterGang's args.
const provisioningArgs = "      provisioningClassName: " + autoscalingv1.ProvisioningClassBestEffortAtomicScaleUp + "\n"

// installProvisioningCRD installs the ProvisioningRequest CRD from the
// pinned module's source.
func (c *cluster) installProvisioningCRD() {
	c.t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", autoscalerAPIs).Output()
	if err != nil {
		c.t.Fatalf("finding %s's source: %v", autoscalerAPIs, err)
	}
	crd := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "autoscaling.x-k8s.io_provisioningrequests.yaml")
	if err := c.InstallCRDFiles(crd); err != nil {
		c.t.Fatalf("installing the ProvisioningRequest CRD: %v", err)
	}
}

// startProvisioningCluster starts a control plane with nodes that run
// background CPU pods under a budget, the ProvisioningRequest CRD, a
// silent stand-in provisioner and muster asking for gangs' nodes.
func startProvisioningCluster(t *testing.T, nodes ...*corev1.Node) (*cluster, *standInProvisioner, func()) {
	t.Helper()
	c := startClusterWithoutScheduler(t, nodes...)
	c.installProvisioningCRD()
	c.addBackground(2, nodes...)
	provisioner := c.startStandInProvisioner()
	return c, provisioner, c.startSchedulerWithArgs(provisioningArgs)
}

// provisionerMode is how the stand-in answers a new request.
type provisionerMode int

const (
	// modeSilent: no answer, as when no autoscaler serves the class.
	modeSilent provisionerMode = iota
	// modeProvision: Accepted, one 8-GPU node per GPU member of the
	// request, then Provisioned.
	modeProvision
	// modeFail: Accepted, then Failed (the node group is at its maximum).
	modeFail
	// modeExpireOnce: the first request Accepted, Provisioned and its
	// booking expired before its nodes came; then modeProvision.
	modeExpireOnce
)

// standInProvisioner answers ProvisioningRequests as cluster-autoscaler's
// documented conditions say, in the mode the test sets.
type standInProvisioner struct {
	c        *cluster
	requests dynamic.NamespaceableResourceInterface

	mu       sync.Mutex
	mode     provisionerMode
	seen     map[types.UID]bool // every request ever seen
	answered map[types.UID]bool
	// coming are the provisioned requests whose nodes have not registered
	// yet; holdNodes keeps them from registering until releaseNodes.
	coming    []*unstructured.Unstructured
	holdNodes bool
	nodes     []string // the nodes it added
}

func (c *cluster) startStandInProvisioner() *standInProvisioner {
	c.t.Helper()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		c.t.Fatal(err)
	}
	s := &standInProvisioner{c: c, requests: dyn.Resource(mustergang.ProvisioningRequests), seen: map[types.UID]bool{}, answered: map[types.UID]bool{}}
	// The stand-in's own control loop (an autoscaler polls too), not a
	// test's synchronisation.
	go wait.UntilWithContext(c.ctx, s.reconcile, 20*time.Millisecond)
	return s
}

// holdNodes, given to setMode, keeps provisioned nodes from registering
// until releaseNodes.
const holdNodes = true

func (s *standInProvisioner) setMode(m provisionerMode, hold ...bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = m
	s.holdNodes = len(hold) > 0 && hold[0]
}

// requestsSeen is how many distinct requests (by UID) it has seen.
func (s *standInProvisioner) requestsSeen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func (s *standInProvisioner) reconcile(ctx context.Context) {
	list, err := s.requests.Namespace(s.c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range list.Items {
		req := &list.Items[i]
		s.seen[req.GetUID()] = true
		if s.answered[req.GetUID()] || s.mode == modeSilent {
			continue
		}
		conds := []any{condition(autoscalingv1.Accepted, "Accepted", "the stand-in accepted the request")}
		switch s.mode {
		case modeFail:
			conds = append(conds, condition(autoscalingv1.Failed, "NotProvisioned", "node group gpu-pool is at its maximum size (5)"))
		case modeExpireOnce:
			conds = append(conds, condition(autoscalingv1.Provisioned, "CapacityIsProvisioned", "the stand-in scaled the node group up"),
				condition(autoscalingv1.BookingExpired, "CapacityReservationTimeExpired", "capacity reservation time expired"))
			s.mode = modeProvision
		default:
			// As cluster-autoscaler: Provisioned once the node group's
			// scale-up is under way; the nodes register afterwards.
			conds = append(conds, condition(autoscalingv1.Provisioned, "Provisioned", "the stand-in scaled the node group up"))
		}
		if err := unstructured.SetNestedSlice(req.Object, conds, "status", "conditions"); err != nil {
			s.c.t.Logf("stand-in provisioner: %v", err)
			continue
		}
		if _, err := s.requests.Namespace(s.c.ns).UpdateStatus(ctx, req, metav1.UpdateOptions{}); err != nil {
			continue // a conflict: the next round
		}
		s.answered[req.GetUID()] = true
		if s.mode == modeProvision && !expired(conds) {
			s.coming = append(s.coming, req)
		}
	}
	if !s.holdNodes {
		s.registerNodes(ctx)
	}
}

// releaseNodes lets the provisioned nodes register (holdNodes kept them).
func (s *standInProvisioner) releaseNodes(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdNodes = false
	s.registerNodes(ctx)
}

// registerNodes adds the nodes of the requests provisioned.
func (s *standInProvisioner) registerNodes(ctx context.Context) {
	for len(s.coming) > 0 {
		if err := s.addNodes(ctx, s.coming[0]); err != nil {
			s.c.t.Logf("stand-in provisioner: %v", err)
			return
		}
		s.coming = s.coming[1:]
	}
}

// addNodes adds an 8-GPU node per GPU pod the request's pod sets ask for.
func (s *standInProvisioner) addNodes(ctx context.Context, req *unstructured.Unstructured) error {
	sets, _, _ := unstructured.NestedSlice(req.Object, "spec", "podSets")
	for _, set := range sets {
		m := set.(map[string]any)
		name, _, _ := unstructured.NestedString(m, "podTemplateRef", "name")
		count, _, _ := unstructured.NestedInt64(m, "count")
		tmpl, err := s.c.Client.CoreV1().PodTemplates(req.GetNamespace()).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("pod set's template %s: %w", name, err)
		}
		gpus := int64(0)
		for _, ctr := range tmpl.Template.Spec.Containers {
			gpus += ctr.Resources.Requests.Name(configv1.DefaultGPUResourceName, "0").Value()
		}
		if gpus == 0 {
			continue // CPU members fit on the nodes there are
		}
		zone := requiredZone(&tmpl.Template.Spec)
		for i := range count {
			w := gpuNode(fmt.Sprintf("scaled-%d", len(s.nodes)+1), 8).Rack("r1")
			if zone != "" {
				w.Zone(zone) // a node group of that zone
			}
			node := w.Obj()
			if err := s.c.createNode(ctx, node); err != nil {
				return fmt.Errorf("adding node %d of %s: %w", i, name, err)
			}
			s.nodes = append(s.nodes, node.Name)
		}
	}
	return nil
}

// requiredZone is the zone a template's required node affinity names, as
// the node group the autoscaler would pick carries it ("" for any).
func requiredZone(spec *corev1.PodSpec) string {
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, r := range term.MatchExpressions {
			if r.Key == corev1.LabelTopologyZone && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 {
				return r.Values[0]
			}
		}
	}
	return ""
}

func expired(conds []any) bool {
	for _, c := range conds {
		if c.(map[string]any)["type"] == autoscalingv1.BookingExpired {
			return true
		}
	}
	return false
}

func condition(typ, reason, message string) any {
	return map[string]any{"type": typ, "status": "True", "reason": reason, "message": message,
		"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339)}
}

// createNode adds a node as the autoscaler's cloud would (a name taken by
// an earlier round is taken).
func (c *cluster) createNode(ctx context.Context, node *corev1.Node) error {
	err := controlplane.CreateNodes(ctx, c.Client, node)
	if apierrors.IsAlreadyExists(errors.Unwrap(err)) {
		return nil
	}
	return err
}

// provisioningRequests lists the test namespace's requests.
func (c *cluster) provisioningRequests() []unstructured.Unstructured {
	c.t.Helper()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		c.t.Fatal(err)
	}
	list, err := dyn.Resource(mustergang.ProvisioningRequests).Namespace(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return list.Items
}

func (c *cluster) podTemplates() []corev1.PodTemplate {
	c.t.Helper()
	list, err := c.Client.CoreV1().PodTemplates(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return list.Items
}

// waitRequest waits for the namespace's one request and returns it.
func (c *cluster) waitRequest() *unstructured.Unstructured {
	c.t.Helper()
	var req *unstructured.Unstructured
	c.waitFor("a ProvisioningRequest", 30*time.Second, func() (bool, error) {
		reqs := c.provisioningRequests()
		if len(reqs) > 1 {
			return false, fmt.Errorf("%d ProvisioningRequests, want one", len(reqs))
		}
		if len(reqs) == 1 {
			req = &reqs[0]
		}
		return req != nil, nil
	})
	return req
}

// waitNothingProvisioning waits until the namespace has no request and no
// PodTemplate left.
func (c *cluster) waitNothingProvisioning() {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			for _, r := range c.provisioningRequests() {
				c.t.Logf("left: ProvisioningRequest %s, status %v", r.GetName(), r.Object["status"])
			}
			for _, p := range c.podTemplates() {
				c.t.Logf("left: PodTemplate %s", p.Name)
			}
		}
	}()
	c.waitFor("no ProvisioningRequest and no PodTemplate left", 30*time.Second, func() (bool, error) {
		return len(c.provisioningRequests()) == 0 && len(c.podTemplates()) == 0, nil
	})
}

// waitConsumers waits until every pod of list carries the request's
// annotations.
func (c *cluster) waitConsumers(request string, want int, list func() []corev1.Pod) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%d members consuming %s", want, request), 30*time.Second, func() (bool, error) {
		pods := list()
		n := 0
		for _, p := range pods {
			if p.Annotations[autoscalingv1.ProvisioningRequestPodAnnotationKey] == request &&
				p.Annotations[autoscalingv1.ProvisioningClassPodAnnotationKey] == autoscalingv1.ProvisioningClassBestEffortAtomicScaleUp {
				n++
			}
		}
		return n == want && len(pods) == want, nil
	})
}

// Four 8-GPU workers and a PS without GPU on a cluster with room for two
// workers (two 8-GPU nodes and a 4-GPU one, each running CPU pods of
// priority 0 under a budget). Pod by pod the autoscaler would see two
// workers that fit and scale for the other two; muster asks for the gang
// as one ProvisioningRequest of two pod sets instead, every member consumes
// it, and nothing is bound until the nodes come. The stand-in provisions;
// the gang binds whole; the request and its PodTemplates are deleted.
func TestGangAsksTheAutoscalerForItsNodes(t *testing.T) {
	c, provisioner, _ := startProvisioningCluster(t, gpuNode("node-1", 8).Rack("r1").Obj(), gpuNode("node-2", 8).Rack("r1").Obj(),
		gpuNode("small-1", 4).Rack("r1").Obj())

	c.createPodGroup("tf", 5, nil)
	for i := range 4 {
		c.createGroupPod("tf", fmt.Sprintf("tf-worker-%d", i), 8)
	}
	c.createGroupPod("tf", "tf-ps-0", 0)
	members := func() []corev1.Pod { return c.groupPods("tf") }

	req := c.waitRequest()
	if class, _, _ := unstructured.NestedString(req.Object, "spec", "provisioningClassName"); class != autoscalingv1.ProvisioningClassBestEffortAtomicScaleUp {
		t.Errorf("request class %q, want %q", class, autoscalingv1.ProvisioningClassBestEffortAtomicScaleUp)
	}
	sets, _, _ := unstructured.NestedSlice(req.Object, "spec", "podSets")
	counts := map[int64]int64{} // GPUs per member → members
	for _, set := range sets {
		m := set.(map[string]any)
		name, _, _ := unstructured.NestedString(m, "podTemplateRef", "name")
		count, _, _ := unstructured.NestedInt64(m, "count")
		tmpl, err := c.Client.CoreV1().PodTemplates(c.ns).Get(c.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod set template %s: %v", name, err)
		}
		if tmpl.Template.Spec.NodeName != "" {
			t.Errorf("template %s names node %q", name, tmpl.Template.Spec.NodeName)
		}
		counts[tmpl.Template.Spec.Containers[0].Resources.Requests.Name(configv1.DefaultGPUResourceName, "0").Value()] += count
	}
	if len(sets) != 2 || counts[8] != 4 || counts[0] != 1 {
		t.Errorf("pod sets %v (GPUs per member: members), want two: 4 workers of 8 GPUs and 1 PS without", counts)
	}
	c.waitConsumers(req.GetName(), 5, members)
	c.waitForEvent("PodGroup", "tf", gang.ReasonProvisioningRequested, req.GetName())
	if bound := countBound(members()); bound != 0 {
		t.Fatalf("%d members bound before the nodes came; a gang that does not fit binds nothing", bound)
	}
	if held := c.holdingPods(); len(held) != 0 {
		t.Fatalf("pods hold capacity while the gang waits for nodes: %v", held)
	}

	provisioner.setMode(modeProvision, holdNodes)
	c.waitForEvent("PodGroup", "tf", gang.ReasonProvisioned, req.GetName())
	if bound := countBound(members()); bound != 0 {
		t.Fatalf("%d members bound before the provisioned nodes registered", bound)
	}
	provisioner.releaseNodes(c.ctx)
	c.waitAllBound("members of tf", 5, members)
	c.waitNothingProvisioning()
	if n := provisioner.requestsSeen(); n != 1 {
		t.Errorf("%d ProvisioningRequests were made, want 1", n)
	}
}

// The autoscaler cannot provision (its node group is at its maximum): the
// gang's object says so, the request goes, and the gang holds nothing. A
// second gang's request is pending when its Job is deleted: the request and
// its PodTemplates go with it.
func TestProvisioningFailsAndTheGangSaysSo(t *testing.T) {
	c, provisioner, _ := startProvisioningCluster(t, gpuNodes(2, 8)...)
	provisioner.setMode(modeFail)

	c.createJob(jobSpec{name: "big", workers: 3, gpus: 8})
	// The request lives for moments (failed, then deleted): the Event and
	// the stand-in's count tell it was made.
	c.waitForEvent("Job", "big", gang.ReasonProvisioningFailed, "node group gpu-pool is at its maximum size")
	if n := provisioner.requestsSeen(); n != 1 {
		t.Errorf("%d ProvisioningRequests for big, want 1 (asked again only after the backoff)", n)
	}
	c.waitFor("the failed request deleted", 30*time.Second, func() (bool, error) {
		return len(c.provisioningRequests()) == 0 && len(c.podTemplates()) == 0, nil
	})
	if held := c.holdingPods(); len(held) != 0 {
		t.Errorf("pods hold capacity after the autoscaler failed: %v", held)
	}
	if bound := countBound(c.jobPods("big")); bound != 0 {
		t.Errorf("%d members of big bound on a cluster without room", bound)
	}
	c.deleteJob("big")

	provisioner.setMode(modeSilent)
	c.createJob(jobSpec{name: "gone", workers: 3, gpus: 8})
	pending := c.waitRequest()
	c.waitConsumers(pending.GetName(), 3, func() []corev1.Pod { return c.jobPods("gone") })
	c.deleteJob("gone")
	c.waitNothingProvisioning()
}

// The capacity booked for a gang's request expires before its nodes come
// (cluster-autoscaler books it for 10 minutes): the gang's object says so,
// muster deletes the request and asks again, and the gang binds on the nodes
// of the second one.
func TestProvisioningBookingExpiredAsksAgain(t *testing.T) {
	c, provisioner, _ := startProvisioningCluster(t, gpuNodes(1, 8)...)
	provisioner.setMode(modeExpireOnce)
	c.createJob(jobSpec{name: "mnist", workers: 2, gpus: 8})
	c.waitForEvent("Job", "mnist", gang.ReasonProvisioningEnded, "capacity reservation time expired")
	c.waitJobBound("mnist", 2)
	c.waitNothingProvisioning()
	if n := provisioner.requestsSeen(); n != 2 {
		t.Errorf("%d ProvisioningRequests were made, want 2 (the expired one and the one asked again)", n)
	}
}

// A gang required in one zone: z1 has a free 8-GPU node, z2 none. Its
// request pins the zone with the most free GPUs (z1), the autoscaler's node
// group there adds the rest, and the gang binds in z1. Unpinned, the new
// nodes could come in any zone and the gang would still not fit in one.
func TestProvisioningPinsTheGangsZone(t *testing.T) {
	c, provisioner, _ := startProvisioningCluster(t, gpuNode("z1-n1", 8).Rack("r1").Zone("z1").Obj(), gpuNode("z2-n1", 8).Rack("r2").Zone("z2").Obj())
	c.fill("z2-n1", 8)
	provisioner.setMode(modeProvision)
	c.createJob(jobSpec{name: "zonal", workers: 3, gpus: 8, annotations: map[string]string{"muster.dev/topology-required": "zone"}})
	pods := c.waitJobBound("zonal", 3)
	for _, p := range pods {
		node, err := c.Client.CoreV1().Nodes().Get(c.ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if zone := node.Labels[corev1.LabelTopologyZone]; zone != "z1" {
			t.Errorf("member %s on %s in zone %q, want z1", p.Name, node.Name, zone)
		}
	}
	c.waitNothingProvisioning()
}

// A worker waiting for the gang's nodes is deleted, and the Job controller
// replaces it: the gang drops below its quorum (its request goes), the
// replacement completes it again, the request is asked for again under the
// same name and the replacement consumes it too; the gang binds whole on
// the provisioned nodes.
func TestProvisioningFollowsAReplacedWorker(t *testing.T) {
	c, provisioner, _ := startProvisioningCluster(t, gpuNodes(1, 8)...)
	// Retries allowed: the Job controller replaces a deleted worker.
	c.createJob(jobSpec{name: "mnist", workers: 2, gpus: 8, mutate: func(j *batchv1.Job) { j.Spec.BackoffLimit = ptr.To[int32](3) }})
	req := c.waitRequest()
	standing := func() []corev1.Pod {
		var out []corev1.Pod
		for _, p := range c.jobPods("mnist") {
			if p.DeletionTimestamp == nil {
				out = append(out, p)
			}
		}
		return out
	}
	c.waitConsumers(req.GetName(), 2, standing)
	replaced := standing()[0]
	if err := c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, replaced.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the worker replaced", 30*time.Second, func() (bool, error) {
		for _, p := range standing() {
			if p.UID == replaced.UID {
				return false, nil
			}
		}
		return len(standing()) == 2, nil
	})
	c.waitConsumers(req.GetName(), 2, standing)
	c.waitRequest()
	provisioner.setMode(modeProvision)
	pods := c.waitAllBound("members of mnist", 2, standing)
	for _, p := range pods {
		if p.UID == replaced.UID {
			t.Errorf("the deleted worker %s was bound", p.Name)
		}
	}
	c.waitNothingProvisioning()
}

// The scheduler restarts while a gang's request is pending: the new one
// adopts the request (no second one, no orphan), and the gang binds when
// the nodes come.
func TestProvisioningSurvivesARestart(t *testing.T) {
	c, provisioner, stop := startProvisioningCluster(t, gpuNodes(1, 8)...)

	c.createJob(jobSpec{name: "mnist", workers: 2, gpus: 8})
	req := c.waitRequest()
	c.waitConsumers(req.GetName(), 2, func() []corev1.Pod { return c.jobPods("mnist") })
	stop()
	c.startSchedulerWithArgs(provisioningArgs)
	// The new scheduler has seen the gang once it announces it again.
	c.waitFor("the restarted scheduler's word on mnist", 60*time.Second, func() (bool, error) {
		events, err := c.Client.EventsV1().Events(c.ns).List(c.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, e := range events.Items {
			if e.Regarding.Name == "mnist" && e.Reason == "GangUnschedulable" {
				n += max(int(e.DeprecatedCount), 1)
				if e.Series != nil {
					n += int(e.Series.Count)
				}
			}
		}
		return n >= 2, nil
	})
	if again := c.waitRequest(); again.GetUID() != req.GetUID() {
		t.Fatalf("after the restart the request is %s (%s), want the first one (%s)", again.GetName(), again.GetUID(), req.GetUID())
	}
	provisioner.setMode(modeProvision)
	c.waitJobBound("mnist", 2)
	c.waitNothingProvisioning()
	if n := provisioner.requestsSeen(); n != 1 {
		t.Errorf("%d ProvisioningRequests were made over the restart, want 1", n)
	}
}

// With provisioningClassName set but no ProvisioningRequest API served,
// nothing is created and no pod is changed. Members waiting for their
// siblings carry no Unschedulable condition (cluster-autoscaler scales only
// for pods that do).
func TestNoProvisioningWithoutTheAPI(t *testing.T) {
	nodes := gpuNodes(2, 8)
	c := startClusterWithoutScheduler(t, nodes...)
	c.addBackground(2, nodes...)
	c.startSchedulerWithArgs(provisioningArgs)

	c.createJob(jobSpec{name: "big", workers: 3, gpus: 8})
	c.waitJobUnschedulable("big", 3)
	c.createPodGroup("half", 3, nil)
	c.createGroupPod("half", "half-0", 8)
	c.createGroupPod("half", "half-1", 8)
	c.waitForEvent("PodGroup", "half", "GangWaitingForMembers", "")

	if tmpls := c.podTemplates(); len(tmpls) != 0 {
		t.Errorf("%d PodTemplates created without the ProvisioningRequest API", len(tmpls))
	}
	for _, p := range append(c.jobPods("big"), c.groupPods("half")...) {
		if _, ok := p.Annotations[autoscalingv1.ProvisioningRequestPodAnnotationKey]; ok {
			t.Errorf("pod %s consumes a ProvisioningRequest that cannot exist", p.Name)
		}
	}
	for _, p := range c.groupPods("half") {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				t.Errorf("pod %s, waiting for its sibling, is Unschedulable: the autoscaler would scale for it", p.Name)
			}
		}
	}
}

// Under the shipped RBAC and admission policies, on an API server that
// enforces them, the scheduler as its ServiceAccount asks for a gang's
// nodes, marks its members and deletes the request when the gang binds;
// it cannot change anything else of a pod, nor create or delete a
// PodTemplate it does not manage.
func TestProvisioningUnderLeastPrivilege(t *testing.T) {
	admin := controlplane.Start(t, "--authorization-mode=RBAC")
	applyManifests(t, admin)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &cluster{ControlPlane: admin, t: t, ctx: ctx, ns: admin.Namespace(t, "autoscaling")}
	c.installProvisioningCRD()
	nodes := gpuNodes(1, 8)
	c.addNodes(nodes...)
	c.addBackground(2, nodes...)
	sched, err := admin.ServiceAccount("muster-system", "muster-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	other := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "not-musters", Namespace: c.ns},
		Template: corev1.PodTemplateSpec{Spec: testobj.WorkerPodSpec("default-scheduler", 0)}}
	if _, err := admin.Client.CoreV1().PodTemplates(c.ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dryRun := []string{metav1.DryRunAll}
	byPolicy := func(err error, policy string) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), policy)
	}
	c.waitFor("the scheduler's admission policy on PodTemplates in force", 30*time.Second, func() (bool, error) {
		err := sched.Client.CoreV1().PodTemplates(c.ns).Delete(ctx, other.Name, metav1.DeleteOptions{DryRun: dryRun})
		return byPolicy(err, "muster-scheduler-provisioning"), nil
	})

	provisioner := c.startStandInProvisioner()
	config, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	config = bytes.Replace(config, []byte("      gangPreemption: true\n"), []byte("      gangPreemption: true\n"+provisioningArgs), 1)
	done, err := sched.StartSchedulerWithConfig(ctx, config)
	if err != nil {
		t.Fatalf("scheduler as its ServiceAccount: %v", err)
	}
	defer func() { cancel(); <-done }()

	c.createJob(jobSpec{name: "mnist", workers: 2, gpus: 8})
	req := c.waitRequest()
	members := func() []corev1.Pod { return c.jobPods("mnist") }
	c.waitConsumers(req.GetName(), 2, members)

	pod := members()[0]
	c.waitFor("the scheduler's admission policy on pods in force", 30*time.Second, func() (bool, error) {
		_, err := sched.Client.CoreV1().Pods(c.ns).Patch(ctx, pod.Name, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"app":"stolen"}}}`), metav1.PatchOptions{DryRun: dryRun})
		return byPolicy(err, "muster-scheduler-pods"), nil
	})
	if _, err := sched.Client.CoreV1().Pods(c.ns).Patch(ctx, pod.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+autoscalingv1.ProvisioningRequestPodAnnotationKey+`":"another"}}}`), metav1.PatchOptions{DryRun: dryRun}); err != nil {
		t.Errorf("the scheduler may not change its own annotation on a member: %v", err)
	}
	unlabelled := other.DeepCopy()
	unlabelled.Name = "unlabelled"
	if _, err := sched.Client.CoreV1().PodTemplates(c.ns).Create(ctx, unlabelled, metav1.CreateOptions{DryRun: dryRun}); !byPolicy(err, "muster-scheduler-provisioning") {
		t.Errorf("the scheduler created a PodTemplate it does not manage: %v", err)
	}

	provisioner.setMode(modeProvision)
	c.waitJobBound("mnist", 2)
	c.waitFor("the request and its PodTemplates deleted", 30*time.Second, func() (bool, error) {
		tmpls := c.podTemplates()
		return len(c.provisioningRequests()) == 0 && len(tmpls) == 1 && tmpls[0].Name == other.Name, nil
	})
}
