package integration

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
)

// A lone pod that asks muster for GPUs is bound to the node that has them,
// and a pod for another scheduler is left alone.
func TestLonePodBoundToGPUNode(t *testing.T) {
	c := startCluster(t,
		gpuNode("cpu-only", 0).Obj(),
		gpuNode("gpu-1", 8).Obj(),
	)
	mine := testobj.MakePod(c.ns, "mine").PodSpec(testobj.WorkerPodSpec(schedulerName, 4)).Obj()
	other := testobj.MakePod(c.ns, "other").PodSpec(testobj.WorkerPodSpec("someone-else", 4)).Obj()
	for _, p := range []*corev1.Pod{mine, other} {
		if _, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor("pod mine bound", 30*time.Second, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "mine", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", err
	})
	got, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "mine", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "gpu-1" {
		t.Errorf("pod mine bound to %q, want gpu-1 (the only node with GPUs)", got.Spec.NodeName)
	}
	// "other" was created together with "mine"; muster has processed its
	// queue, and a pod of another scheduler must still be untouched.
	o, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o.Spec.NodeName != "" || len(o.Status.Conditions) != 0 {
		t.Errorf("pod for another scheduler was touched: node %q, conditions %v", o.Spec.NodeName, o.Status.Conditions)
	}
}

// The scheduler command, as a process, with the shipped config file and
// --kubeconfig (which plain kube-scheduler ignores next to --config).
func TestSchedulerCommandWithShippedConfigAndKubeconfig(t *testing.T) {
	cp := controlplane.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &cluster{ControlPlane: cp, t: t, ctx: ctx, ns: cp.Namespace(t, "cmd")}
	c.addNodes(gpuNodes(1, 8)...)
	cmd := exec.CommandContext(ctx, os.Args[0], "--config=../../manifests/scheduler/scheduler-config.yaml",
		"--kubeconfig="+cp.Kubeconfig, "--leader-elect=false", "--secure-port=0")
	cmd.Env = append(os.Environ(), runAsScheduler+"=1")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("scheduler output (tail):\n%s", tail(out.String(), 3000))
		}
	}()
	w, err := c.Client.CoreV1().Pods(c.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	c.createJob(jobSpec{name: "cmd", workers: 2, gpus: 4})
	c.waitJobBound("cmd", 2)

	// The command turns NominatedNodeNameForExpectation off: the member that
	// waited at Permit for its sibling was never patched with a nomination
	// (one API call per pod saved).
	bound := map[string]bool{}
	for len(bound) < 2 {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-time.After(30 * time.Second):
			t.Fatalf("the watch showed %d of 2 bindings", len(bound))
		}
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok {
			t.Fatalf("watch: %v", ev.Object)
		}
		if pod.Spec.NodeName == "" && pod.Status.NominatedNodeName != "" {
			t.Errorf("pod %s was nominated to %s while waiting", pod.Name, pod.Status.NominatedNodeName)
		}
		if pod.Spec.NodeName != "" {
			bound[pod.Name] = true
		}
	}
}
