package integration

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"

	"github.com/muster-sched/muster/internal/testobj"
)

// gpuNode starts a Ready node of gpus GPUs, as the tests create them.
func gpuNode(name string, gpus int64) *testobj.NodeWrapper {
	return testobj.MakeNode(name).GPUs(gpus).Ready()
}

// gpuNodes is n nodes node-1..node-n of gpus GPUs in rack r1.
func gpuNodes(n int, gpus int64) []*corev1.Node {
	nodes := make([]*corev1.Node, n)
	for i := range nodes {
		nodes[i] = gpuNode(fmt.Sprintf("node-%d", i+1), gpus).Rack("r1").Obj()
	}
	return nodes
}

// A 4 × 8-GPU gang on 4 free 8-GPU nodes: all four bound, one per node.
func TestGangFitsExactly(t *testing.T) {
	c := startCluster(t, gpuNodes(4, 8)...)
	c.createJob(jobSpec{name: "mnist", workers: 4, gpus: 8})
	pods := c.waitJobBound("mnist", 4)
	if got := len(nodesOf(pods)); got != 4 {
		t.Errorf("gang spread over %d nodes, want 4 (one 8-GPU worker per node): %v", got, nodesOf(pods))
	}
}

// On 3 free nodes the same gang binds nothing, holds nothing, and says why;
// a fourth node alone is enough to get all four bound.
func TestGangWaitsWholeThenBindsWhenNodeAdded(t *testing.T) {
	c := startCluster(t, gpuNodes(3, 8)...)
	c.createJob(jobSpec{name: "mnist", workers: 4, gpus: 8})
	pods := c.waitJobUnschedulable("mnist", 4, "gang "+c.ns+"/mnist needs 4 members of 8 nvidia.com/gpu", "at most 3 fit")
	if held := c.holdingPods(); len(held) != 0 {
		t.Fatalf("pods hold GPUs while the gang cannot fit: %v", held)
	}
	if n := countBound(pods); n != 0 {
		t.Fatalf("%d pods bound, want 0", n)
	}
	c.waitForEvent("Job", "mnist", "GangUnschedulable", "at most 3 fit")

	c.addNodes(gpuNode("node-4", 8).Rack("r1").Obj())
	c.waitJobBound("mnist", 4)
}

// Two 3 × 8-GPU gangs on 4 nodes, in several interleavings: exactly one is
// bound, the other holds nothing; deleting the winner lets the other bind.
func TestCompetingGangsNeverDeadlock(t *testing.T) {
	orders := map[string]func(c *cluster){
		"a-then-b": func(c *cluster) {
			c.createJob(jobSpec{name: "a", workers: 3, gpus: 8})
			c.createJob(jobSpec{name: "b", workers: 3, gpus: 8})
		},
		"b-then-a": func(c *cluster) {
			c.createJob(jobSpec{name: "b", workers: 3, gpus: 8})
			c.createJob(jobSpec{name: "a", workers: 3, gpus: 8})
		},
		"concurrent": func(c *cluster) {
			var wg sync.WaitGroup
			for _, name := range []string{"a", "b"} {
				wg.Go(func() { c.createJob(jobSpec{name: name, workers: 3, gpus: 8}) })
			}
			wg.Wait()
		},
	}
	for name, submit := range orders {
		t.Run(name, func(t *testing.T) {
			c := startCluster(t, gpuNodes(4, 8)...)
			obs := c.observeGangs(map[string]int{"a": 3, "b": 3})
			submit(c)
			var winner, loser string
			c.waitFor("one gang bound, the other unschedulable", 60*time.Second, func() (bool, error) {
				a, b := countBound(c.jobPods("a")), countBound(c.jobPods("b"))
				switch {
				case a == 3 && b == 0:
					winner, loser = "a", "b"
				case b == 3 && a == 0:
					winner, loser = "b", "a"
				default:
					return false, nil
				}
				for _, p := range c.jobPods(loser) {
					if !unschedulableWith(&p, "gang "+c.ns+"/"+loser) {
						return false, nil
					}
				}
				return len(c.jobPods(loser)) == 3, nil
			})
			for _, p := range c.jobPods(loser) {
				if p.Status.NominatedNodeName != "" || p.Spec.NodeName != "" {
					t.Errorf("losing gang's pod %s holds node %q/%q", p.Name, p.Spec.NodeName, p.Status.NominatedNodeName)
				}
			}
			c.deleteJob(winner)
			c.waitJobBound(loser, 3)
			obs.check(t, 10*time.Second)
		})
	}
}

// Ten gangs of random size on 8 nodes with a fixed seed: gangs complete one
// after another as earlier ones are deleted, never one partly bound for
// longer than binding takes, and nothing partial at the end.
func TestRandomGangMixHasNoPartialGang(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 7))
	c := startCluster(t, gpuNodes(8, 8)...)
	sizes := map[string]int{}
	var names []string
	for i := range 10 {
		name := fmt.Sprintf("job-%d", i)
		sizes[name] = 1 + rng.IntN(6)
		names = append(names, name)
	}
	obs := c.observeGangs(sizes)
	for _, name := range names {
		c.createJob(jobSpec{name: name, workers: int32(sizes[name]), gpus: int64(2 + 2*rng.IntN(4))})
	}
	// Let the cluster drain: whenever some gangs are fully bound, delete
	// them, until every gang has run.
	done := map[string]bool{}
	c.waitFor("every gang bound once", 3*time.Minute, func() (bool, error) {
		for _, name := range names {
			if !done[name] && countBound(c.jobPods(name)) == sizes[name] {
				done[name] = true
				c.deleteJob(name)
			}
		}
		return len(done) == len(names), nil
	})
	obs.check(t, 10*time.Second)
}

// gangObserver watches pods and records, per job, when it became partly
// bound and when it stopped being so.
type gangObserver struct {
	mu      sync.Mutex
	sizes   map[string]int
	bound   map[string]map[string]bool
	since   map[string]time.Time
	longest map[string]time.Duration
}

// observeGangs watches the pods of Jobs; observeGangsBy those of gangs named
// by another pod label (a PodGroup's, a TFJob's).
func (c *cluster) observeGangs(sizes map[string]int) *gangObserver {
	return c.observeGangsBy(batchv1.JobNameLabel, sizes)
}

func (c *cluster) observeGangsBy(key string, sizes map[string]int) *gangObserver {
	o := &gangObserver{sizes: sizes, bound: map[string]map[string]bool{}, since: map[string]time.Time{}, longest: map[string]time.Duration{}}
	w, err := c.Client.CoreV1().Pods(c.ns).Watch(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || pod.Labels[key] == "" {
				continue
			}
			o.observe(pod.Labels[key], pod.Name, ev.Type != watch.Deleted && pod.Spec.NodeName != "")
		}
	}()
	return o
}

func (o *gangObserver) observe(job, pod string, bound bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.bound[job] == nil {
		o.bound[job] = map[string]bool{}
	}
	if bound {
		o.bound[job][pod] = true
	} else {
		delete(o.bound[job], pod)
	}
	n := len(o.bound[job])
	partial := n > 0 && n < o.sizes[job]
	start, was := o.since[job]
	switch {
	case partial && !was:
		o.since[job] = time.Now()
	case !partial && was:
		o.longest[job] = max(o.longest[job], time.Since(start))
		delete(o.since, job)
	}
}

// check fails if a gang was ever partly bound for longer than limit (binding
// N pods is not atomic, so a short partial window is expected), or is
// partial now. Deleting a job makes it partial while its pods go away, which
// the observer sees as such: only unbound→bound growth is judged, so the
// window is measured from the first bound member.
func (o *gangObserver) check(t *testing.T, limit time.Duration) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for job, d := range o.longest {
		if d > limit {
			t.Errorf("gang %s was partly bound for %s (limit %s)", job, d, limit)
		}
	}
	for job, start := range o.since {
		if time.Since(start) > limit {
			t.Errorf("gang %s is partly bound (%d of %d) since %s", job, len(o.bound[job]), o.sizes[job], start.Format(time.RFC3339))
		}
	}
}

// waitForEvent waits for an Event on the object with the reason and a
// message containing part.
func (c *cluster) waitForEvent(kind, name, reason, part string) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("event %s on %s %s", reason, kind, name), 30*time.Second, func() (bool, error) {
		events, err := c.Client.EventsV1().Events(c.ns).List(c.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason && contains(e.Note, part) {
				return true, nil
			}
		}
		return false, nil
	})
}

// A gang refused for another plugin's sake (a taint its members do not
// tolerate) is retried when a toleration is added to its members: the
// framework asks only MusterGang about a member MusterGang's plan check
// refused, and MusterGang answers with TaintToleration's hint. Without it
// the members would wait for the queue's five-minute flush.
func TestGangRefusedByATaintIsPlacedWhenItsMembersTolerateIt(t *testing.T) {
	taint := corev1.Taint{Key: "dedicated", Value: "training", Effect: corev1.TaintEffectNoSchedule}
	nodes := []*corev1.Node{gpuNode("node-1", 8).Taint(taint).Obj(), gpuNode("node-2", 8).Taint(taint).Obj()}
	c := startCluster(t, nodes...)
	// Priority-0 CPU pods (bound by name, past the taint) and their
	// PodDisruptionBudget on both nodes, as on a shared cluster.
	c.addBackground(4, nodes...)
	c.createJob(jobSpec{name: "tainted", workers: 2, gpus: 8})
	pods := c.waitJobUnschedulable("tainted", 2, "2 of them no member may use")
	if held := c.holdingPods(); len(held) != 0 {
		t.Fatalf("pods hold capacity while no node tolerates them: %v", held)
	}
	for _, p := range pods {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{Key: taint.Key, Operator: corev1.TolerationOpEqual,
				Value: taint.Value, Effect: taint.Effect})
			_, err = c.Client.CoreV1().Pods(c.ns).Update(c.ctx, pod, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatalf("adding a toleration to %s: %v", p.Name, err)
		}
	}
	c.waitJobBound("tainted", 2)
}
