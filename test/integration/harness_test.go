package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/manifests"
)

const schedulerName = "muster"

// cluster is one test's control plane with the muster scheduler running.
type cluster struct {
	*controlplane.ControlPlane
	t   *testing.T
	ctx context.Context
	ns  string
	// backgroundNS holds the background pods (addBackground), if any.
	backgroundNS string
}

// startCluster starts a fresh control plane, creates nodes and starts the
// scheduler configured from the shipped manifests/scheduler/scheduler-config.yaml.
func startCluster(t *testing.T, nodes ...*corev1.Node) *cluster {
	t.Helper()
	return startClusterWith(t, "", nodes...)
}

// startClusterWith is startCluster with extra top-level configuration
// appended to the shipped scheduler configuration (e.g. an extender).
func startClusterWith(t *testing.T, extraConfig string, nodes ...*corev1.Node) *cluster {
	t.Helper()
	c := startClusterWithoutScheduler(t, nodes...)
	c.startScheduler(extraConfig)
	return c
}

// startClusterWithoutScheduler starts a control plane with nodes; the test
// prepares what a scheduler would find and starts one itself.
func startClusterWithoutScheduler(t *testing.T, nodes ...*corev1.Node) *cluster {
	t.Helper()
	return startClusterWithFlags(t, nil, nodes...)
}

// startClusterWithFlags is startClusterWithoutScheduler with extra
// kube-apiserver flags.
func startClusterWithFlags(t *testing.T, apiserverFlags []string, nodes ...*corev1.Node) *cluster {
	t.Helper()
	cp := controlplane.Start(t, apiserverFlags...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &cluster{ControlPlane: cp, t: t, ctx: ctx, ns: cp.Namespace(t, "test")}
	c.addNodes(nodes...)
	return c
}

// startScheduler runs a scheduler (the shipped configuration plus
// extraConfig) until the test ends; the returned function stops it earlier
// and waits for it to exit.
func (c *cluster) startScheduler(extraConfig ...string) (stop func()) {
	c.t.Helper()
	config, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, extra := range extraConfig {
		config = append(config, extra...)
	}
	return c.startSchedulerWithConfig(config)
}

// startSchedulerWithArgs is startScheduler with lines (YAML, indented as
// MusterGang's args are) added to MusterGang's args in the shipped
// configuration.
func (c *cluster) startSchedulerWithArgs(lines string) (stop func()) {
	c.t.Helper()
	config, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		c.t.Fatal(err)
	}
	const anchor = "      gangPreemption: true\n"
	if !bytes.Contains(config, []byte(anchor)) {
		c.t.Fatalf("the shipped scheduler configuration has no line %q to add MusterGang's args after", anchor)
	}
	return c.startSchedulerWithConfig(bytes.Replace(config, []byte(anchor), []byte(anchor+lines), 1))
}

func (c *cluster) startSchedulerWithConfig(config []byte) (stop func()) {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.ctx)
	done, err := c.StartSchedulerWithConfig(ctx, config, "--v=2")
	if err != nil {
		cancel()
		c.t.Fatalf("starting scheduler: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				c.t.Errorf("scheduler did not stop within 30s")
			}
		})
	}
	c.t.Cleanup(stop)
	return stop
}

func (c *cluster) addNodes(nodes ...*corev1.Node) {
	c.t.Helper()
	if err := controlplane.CreateNodes(c.ctx, c.Client, nodes...); err != nil {
		c.t.Fatal(err)
	}
}

// jobSpec describes an Indexed Job of GPU workers.
type jobSpec struct {
	name        string
	workers     int32
	gpus        int64
	annotations map[string]string
	scheduler   string
	labels      map[string]string // on the Job
	subdomain   string
	mutate      func(*batchv1.Job)
}

func (c *cluster) createJob(s jobSpec) *batchv1.Job {
	c.t.Helper()
	if s.scheduler == "" {
		s.scheduler = schedulerName
	}
	w := testobj.MakeJob(c.ns, s.name).Indexed().Workers(s.workers).BackoffLimit(0).
		PodSpec(testobj.WorkerPodSpec(s.scheduler, s.gpus)).Subdomain(s.subdomain)
	for k, v := range s.labels {
		w.Label(k, v)
	}
	for k, v := range s.annotations {
		w.PodAnnotation(k, v)
	}
	job := w.Obj()
	if s.mutate != nil {
		s.mutate(job)
	}
	created, err := c.Client.BatchV1().Jobs(c.ns).Create(c.ctx, job, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating job %s: %v", s.name, err)
	}
	return created
}

func (c *cluster) deleteJob(name string) {
	c.t.Helper()
	if err := controlplane.DeleteJob(c.ctx, c.Client, c.ns, name); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) jobPods(name string) []corev1.Pod {
	c.t.Helper()
	return c.podsLabelled(batchv1.JobNameLabel, name)
}

// podsLabelled lists the test namespace's pods with label key=value.
func (c *cluster) podsLabelled(key, value string) []corev1.Pod {
	c.t.Helper()
	pods, err := c.Client.CoreV1().Pods(c.ns).List(c.ctx, metav1.ListOptions{LabelSelector: key + "=" + value})
	if err != nil {
		c.t.Fatal(err)
	}
	return pods.Items
}

// waitFor polls cond every 100ms until it holds or timeout passes.
func (c *cluster) waitFor(what string, timeout time.Duration, cond func() (bool, error)) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond() })
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitJobBound waits until the job has want pods and all are bound.
func (c *cluster) waitJobBound(name string, want int) []corev1.Pod {
	c.t.Helper()
	return c.waitAllBound(fmt.Sprintf("pods of job %s", name), want, func() []corev1.Pod { return c.jobPods(name) })
}

// waitAllBound waits until list returns want pods, all bound.
func (c *cluster) waitAllBound(what string, want int, list func() []corev1.Pod) []corev1.Pod {
	c.t.Helper()
	var pods []corev1.Pod
	c.waitFor(fmt.Sprintf("%d %s bound", want, what), 60*time.Second, func() (bool, error) {
		pods = list()
		return len(pods) == want && countBound(pods) == want, nil
	})
	return pods
}

// waitJobUnschedulable waits until the job has want pods, each with
// PodScheduled=False whose message contains every part of want.
func (c *cluster) waitJobUnschedulable(name string, want int, msgParts ...string) []corev1.Pod {
	c.t.Helper()
	var pods []corev1.Pod
	defer func() {
		if c.t.Failed() {
			for _, p := range pods {
				c.t.Logf("pod %s: node %q nominated %q conditions %+v", p.Name, p.Spec.NodeName, p.Status.NominatedNodeName, p.Status.Conditions)
			}
		}
	}()
	c.waitFor(fmt.Sprintf("%d pods of job %s unschedulable with %q", want, name, msgParts), 60*time.Second, func() (bool, error) {
		pods = c.jobPods(name)
		if len(pods) != want {
			return false, nil
		}
		for _, p := range pods {
			if !unschedulableWith(&p, msgParts...) {
				return false, nil
			}
		}
		return true, nil
	})
	return pods
}

func unschedulableWith(p *corev1.Pod, parts ...string) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type != corev1.PodScheduled || cond.Status != corev1.ConditionFalse {
			continue
		}
		for _, part := range parts {
			if !strings.Contains(cond.Message, part) {
				return false
			}
		}
		return true
	}
	return false
}

func countBound(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// heldGPUs counts pods of the namespace that hold capacity: bound, or
// nominated (waiting at Permit).
func (c *cluster) holdingPods() []string {
	c.t.Helper()
	pods, err := c.Client.CoreV1().Pods(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
			out = append(out, p.Name)
		}
	}
	return out
}

func nodesOf(pods []corev1.Pod) map[string]int {
	out := map[string]int{}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			out[p.Spec.NodeName]++
		}
	}
	return out
}

func contains(s, part string) bool { return strings.Contains(s, part) }
