package integration

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	applyv1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
)

// kubelet stands in for the kubelets of the test's nodes in one respect:
// a bound pod being deleted finishes terminating (it is removed). It
// records which pods carried the DisruptionTarget condition when they went.
type kubelet struct {
	c         *cluster
	running   atomic.Bool
	mu        sync.Mutex
	disrupted map[string]bool
	removed   []string
}

func (c *cluster) startKubelet() *kubelet {
	k := &kubelet{c: c, disrupted: map[string]bool{}}
	k.running.Store(true)
	ctx, cancel := context.WithCancel(c.ctx)
	c.t.Cleanup(cancel)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !k.running.Load() {
				continue
			}
			pods, err := c.Client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil || p.Spec.NodeName == "" {
					continue
				}
				disrupted := false
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue && cond.Reason == corev1.PodReasonPreemptionByScheduler {
						disrupted = true
					}
				}
				err := c.Client.CoreV1().Pods(c.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				if err == nil {
					k.mu.Lock()
					k.removed = append(k.removed, p.Name)
					k.disrupted[p.Name] = disrupted
					k.mu.Unlock()
				}
			}
		}
	}()
	return k
}

// removedPods lists the pods the kubelet removed and whether each carried
// the DisruptionTarget condition.
func (k *kubelet) removedPods() map[string]bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]bool{}
	for _, name := range k.removed {
		out[name] = k.disrupted[name]
	}
	return out
}

// startPreemptionCluster starts a cluster of nodes on a real cluster's
// background (perNode priority-0 CPU pods on each, a budget over some), with
// the priority classes and the kubelet stand-in preemption tests need.
func startPreemptionCluster(t *testing.T, perNode int, nodes ...*corev1.Node) (*cluster, *kubelet) {
	t.Helper()
	c := startCluster(t, nodes...)
	c.createPriorityClasses()
	c.addBackground(perNode, nodes...)
	return c, c.startKubelet()
}

// startRestartablePreemptionCluster is startPreemptionCluster with the
// scheduler's stop, for tests that restart it.
func startRestartablePreemptionCluster(t *testing.T, perNode int, nodes ...*corev1.Node) (c *cluster, k *kubelet, stop func()) {
	t.Helper()
	c = startClusterWithoutScheduler(t, nodes...)
	c.createPriorityClasses()
	c.addBackground(perNode, nodes...)
	k = c.startKubelet()
	return c, k, c.startScheduler()
}

func (c *cluster) createPriorityClasses() {
	c.t.Helper()
	for _, pc := range []*schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "low"}, Value: 10},
		{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000},
		// Priority admission takes preemptionPolicy from the class.
		{ObjectMeta: metav1.ObjectMeta{Name: "high-never"}, Value: 1000, PreemptionPolicy: ptr.To(corev1.PreemptNever)},
	} {
		if _, err := c.Client.SchedulingV1().PriorityClasses().Create(c.ctx, pc, metav1.CreateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
}

func withPriority(class string, mutate ...func(*batchv1.Job)) func(*batchv1.Job) {
	return func(job *batchv1.Job) {
		job.Spec.Template.Spec.PriorityClassName = class
		for _, m := range mutate {
			m(job)
		}
	}
}

// liveBound counts the job's pods that are bound and not being deleted.
func (c *cluster) liveBound(job string) int {
	n := 0
	for _, p := range c.jobPods(job) {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodFailed {
			n++
		}
	}
	return n
}

func (c *cluster) fillWithGangs(priority string, gangs map[string]int32) {
	c.t.Helper()
	names := make([]string, 0, len(gangs))
	for name := range gangs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c.createJob(jobSpec{name: name, workers: gangs[name], gpus: 8, mutate: withPriority(priority)})
		c.waitJobBound(name, int(gangs[name]))
	}
}

func TestPreemptionEvictsOneWholeGang(t *testing.T) {
	c, k := startPreemptionCluster(t, 4, gpuNodes(4, 8)...)
	c.fillWithGangs("low", map[string]int32{"low-a": 2, "low-b": 2})

	c.createJob(jobSpec{name: "high", workers: 2, gpus: 8, mutate: withPriority("high")})
	c.waitJobBound("high", 2)
	a, b := c.liveBound("low-a"), c.liveBound("low-b")
	if !(a == 0 && b == 2 || a == 2 && b == 0) {
		t.Fatalf("low gangs left running: low-a %d, low-b %d; want one evicted whole, the other untouched", a, b)
	}
	victim := "low-a"
	if a == 2 {
		victim = "low-b"
	}
	removed := k.removedPods()
	if len(removed) != 2 {
		t.Errorf("removed %v, want exactly the 2 pods of %s", removed, victim)
	}
	for name, disrupted := range removed {
		if !disrupted {
			t.Errorf("victim %s had no DisruptionTarget condition", name)
		}
	}
	c.waitForEvent("Job", victim, "Preempted", c.ns+"/high")
	c.waitForEvent("Job", "high", "GangPreempting", victim)
	if got := c.backgroundLeft(); got != 16 {
		t.Errorf("%d of 16 background CPU pods left", got)
	}
}

func TestPreemptionEvictsFewestGPUs(t *testing.T) {
	c, k := startPreemptionCluster(t, 4, gpuNodes(6, 8)...)
	c.fillWithGangs("low", map[string]int32{"one-a": 1, "one-b": 1, "one-c": 1, "one-d": 1, "two": 2})

	c.createJob(jobSpec{name: "high", workers: 3, gpus: 8, mutate: withPriority("high")})
	c.waitJobBound("high", 3)
	// Any three freed nodes are 24 GPUs; the fewest units doing that are the
	// 2-node gang and one 1-node gang.
	if got := len(k.removedPods()); got != 3 {
		t.Errorf("evicted %d pods (%v), want 3 (24 GPUs)", got, k.removedPods())
	}
	if c.liveBound("two") != 0 {
		t.Errorf("the 2-node gang was not the one evicted (fewest units)")
	}
	evictedOnes := 0
	for _, job := range []string{"one-a", "one-b", "one-c", "one-d"} {
		if c.liveBound(job) == 0 {
			evictedOnes++
		}
	}
	if evictedOnes != 1 {
		t.Errorf("%d 1-node gangs evicted, want 1", evictedOnes)
	}
	if got := c.backgroundLeft(); got != 24 {
		t.Errorf("%d of 24 background CPU pods left", got)
	}
}

func TestPreemptionNeverAndEqualPriorityEvictNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*batchv1.Job)
	}{
		{"preemptionPolicy Never", withPriority("high-never")},
		{"equal priority", withPriority("low")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, k := startPreemptionCluster(t, 4, gpuNodes(2, 8)...)
			c.fillWithGangs("low", map[string]int32{"low": 2})
			c.createJob(jobSpec{name: "waiting", workers: 2, gpus: 8, mutate: tc.mutate})
			c.waitJobUnschedulable("waiting", 2, "gang")
			for _, p := range c.jobPods("waiting") {
				if p.Status.NominatedNodeName != "" {
					t.Errorf("pod %s nominated to %s", p.Name, p.Status.NominatedNodeName)
				}
			}
			// Room arrives: the gang is placed there. Any eviction started by
			// its earlier failed attempts would be over by now.
			c.addNodes(gpuNode("node-new", 16).Rack("r1").Obj())
			c.waitJobBound("waiting", 2)
			if got := c.liveBound("low"); got != 2 {
				t.Errorf("the low gang has %d running pods, want 2", got)
			}
			if removed := k.removedPods(); len(removed) != 0 {
				t.Errorf("evicted %v", removed)
			}
		})
	}
}

func TestPreemptorDeletedReleasesItsHold(t *testing.T) {
	c, k := startPreemptionCluster(t, 4, gpuNodes(2, 8)...)
	c.fillWithGangs("low", map[string]int32{"low": 2})
	k.running.Store(false) // the victims stay terminating for now

	c.createJob(jobSpec{name: "high", workers: 2, gpus: 8, mutate: withPriority("high")})
	c.waitFor("the low gang's pods terminating", 30*time.Second, func() (bool, error) {
		return c.liveBound("low") == 0, nil
	})
	c.waitFor("a preemptor pod nominated", 30*time.Second, func() (bool, error) {
		for _, p := range c.jobPods("high") {
			if p.Status.NominatedNodeName != "" {
				return true, nil
			}
		}
		return false, nil
	})
	c.deleteJob("high")
	k.running.Store(true)
	// The held capacity is free again: another low gang takes both nodes
	// long before the preemptor's plan deadline (120 s) would end the hold.
	c.createJob(jobSpec{name: "next", workers: 2, gpus: 8, mutate: withPriority("low")})
	c.waitJobBound("next", 2)
}

// A scheduler restarted while the pods a gang preempted still terminate
// (a long grace period, to checkpoint: here the kubelet stand-in is
// paused) evicts no other gang. The new
// scheduler knows nothing of the preemption; the preemptor's nomination,
// written by the first one, names the node where its victim terminates,
// and the gang waits for it. Once the victim is gone the gang runs there.
func TestRestartDuringPreemptionEvictsNoOtherGang(t *testing.T) {
	c, k, stop := startRestartablePreemptionCluster(t, 4, gpuNodes(3, 8)...)
	lows := []string{"low-a", "low-b", "low-c"}
	c.fillWithGangs("low", map[string]int32{"low-a": 1, "low-b": 1, "low-c": 1})
	k.running.Store(false) // the victim stays terminating until the kubelet runs again

	c.createJob(jobSpec{name: "high", workers: 1, gpus: 8, mutate: withPriority("high")})
	var nominated string
	c.waitFor("a low gang preempted and the preemptor nominated", 30*time.Second, func() (bool, error) {
		terminating := 0
		for _, job := range lows {
			terminating += 1 - c.liveBound(job)
		}
		for _, p := range c.jobPods("high") {
			nominated = p.Status.NominatedNodeName
		}
		return terminating == 1 && nominated != "", nil
	})
	stop()

	c.startScheduler()
	c.waitJobUnschedulable("high", 1, "waits for 1 pods it preempted to terminate")
	live := 0
	for _, job := range lows {
		live += c.liveBound(job)
	}
	if live != 2 {
		t.Fatalf("%d of the 2 other low gangs still run after the restart", live)
	}

	k.running.Store(true)
	pods := c.waitJobBound("high", 1)
	if pods[0].Spec.NodeName != nominated {
		t.Errorf("high bound on %s, want %s, where its victim was", pods[0].Spec.NodeName, nominated)
	}
	live = 0
	for _, job := range lows {
		live += c.liveBound(job)
	}
	if live != 2 || len(k.removedPods()) != 1 {
		t.Errorf("%d other low gangs run, %d pods removed (%v); want 2 and 1", live, len(k.removedPods()), k.removedPods())
	}
}

// A scheduler that stopped halfway through a gang preemption (it had
// marked both pods of the victim gang and deleted one) leaves the rest to
// the next one: on start, it deletes the rest of the marked gang, so no
// half gang holds GPUs, and leaves the unmarked gang alone.
func TestRestartFinishesAHalfDonePreemption(t *testing.T) {
	c, k, stop := startRestartablePreemptionCluster(t, 4, gpuNodes(3, 8)...)
	// The victim's Job does not count its preempted pods as failures (a
	// Job that failed would delete the rest of the gang itself).
	c.createJob(jobSpec{name: "victim", workers: 2, gpus: 8, mutate: withPriority("low", func(job *batchv1.Job) {
		job.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action:          batchv1.PodFailurePolicyActionIgnore,
			OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
		}}}
	})})
	c.waitJobBound("victim", 2)
	c.fillWithGangs("low", map[string]int32{"other": 1})
	stop()

	victims := c.jobPods("victim")
	for _, p := range victims {
		condition := applyv1.PodCondition().WithType(corev1.DisruptionTarget).WithStatus(corev1.ConditionTrue).
			WithReason(corev1.PodReasonPreemptionByScheduler).WithMessage(schedulerName + ": muster gang preemption, to accommodate Job " + c.ns + "/high").
			WithLastTransitionTime(metav1.Now())
		apply := applyv1.Pod(p.Name, p.Namespace).WithStatus(applyv1.PodStatus().WithConditions(condition))
		if _, err := c.Client.CoreV1().Pods(c.ns).ApplyStatus(c.ctx, apply, metav1.ApplyOptions{FieldManager: "muster-scheduler", Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, victims[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the first victim removed", 30*time.Second, func() (bool, error) {
		_, removed := k.removedPods()[victims[0].Name]
		return removed, nil
	})

	c.startScheduler()
	c.waitFor("the rest of the victim gang removed", 30*time.Second, func() (bool, error) {
		_, removed := k.removedPods()[victims[1].Name]
		return removed, nil
	})
	c.waitForEvent("Job", "victim", "Preempted", "finishing the preemption of 1 pods")
	if removed := k.removedPods(); len(removed) != 2 || !removed[victims[1].Name] {
		t.Errorf("removed %v, want the two victims, each a disruption target", removed)
	}
	if c.liveBound("other") != 1 {
		t.Errorf("the unmarked gang was preempted")
	}
}
