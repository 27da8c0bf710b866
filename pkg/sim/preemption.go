package sim

import (
	"container/heap"
	"context"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/muster-sched/muster/pkg/plugins/mustergang"
	"github.com/muster-sched/muster/pkg/sim/measure"
)

// Preemption in the simulator. A scheduler preempts by deleting pods through
// the API (in a goroutine of its own, after the scheduling cycle). The
// simulator tells those deletions from its own by name: it announces every
// pod it deletes itself. A step is not settled while an eviction goroutine
// runs. After the step, each gang that lost members is stopped whole and
// resubmitted at the same virtual instant, as a MultiWorkerMirroredStrategy
// job that lost a worker fails and is rerun by its Job.

// deletions tells the scheduler's pod deletions from the simulator's.
type deletions struct {
	mu      sync.Mutex
	own     map[string]bool
	evicted []string
}

// mine announces that the simulator is about to delete pod name.
func (d *deletions) mine(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.own == nil {
		d.own = map[string]bool{}
	}
	d.own[name] = true
}

// record notes a deletion of name and reports whether the scheduler made it.
func (d *deletions) record(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.own[name] {
		delete(d.own, name)
		return false
	}
	d.evicted = append(d.evicted, name)
	return true
}

func (d *deletions) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.evicted
	d.evicted = nil
	return out
}

// deleteReactor sees every pod deletion before the tracker applies it. A
// deletion the simulator did not announce is a preemption: it is recorded,
// and the informers' delete is awaited like the simulator's own. A pod
// that owns ResourceClaims will have them released (dra.go). It runs
// under the fake's lock, so it uses only the tracker.
func (h *harness) deleteReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	del, ok := action.(k8stesting.DeleteAction)
	if !ok {
		return false, nil, nil
	}
	obj, err := h.cs.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), del.GetNamespace(), del.GetName())
	if err != nil {
		return false, nil, nil // the tracker answers NotFound; no delete event follows
	}
	if pod, ok := obj.(*v1.Pod); ok && h.dra != nil {
		h.dra.podDeleting(h, pod)
	}
	if h.deletions.record(del.GetName()) {
		h.counts.want(kindPodDelete)
	}
	return false, nil, nil
}

// evictionsInFlight counts preemptions whose victims are still being
// deleted: muster's eviction goroutines, and kube-scheduler's asynchronous
// preemptions (started when their victims are counted, done when the
// goroutine's execution is counted).
func (h *harness) evictionsInFlight() (float64, error) {
	if isMuster(h.opts.Scheduler) {
		return testutil.GetGaugeMetricValue(schedmetrics.Goroutines.WithLabelValues(mustergang.EvictionOperation))
	}
	// Read the series themselves: gathering the whole registry, as the
	// readers by name do, on every poll of the settle loop took CPU from
	// the scheduler it was waiting for.
	started := histogramCount(schedmetrics.PreemptionVictims) + histogramCount(schedmetrics.WorkloadPreemptionVictims)
	done := 0.0
	for _, result := range []string{schedmetrics.GoroutineResultSuccess, schedmetrics.GoroutineResultError} {
		v, err := testutil.GetCounterMetricValue(schedmetrics.PreemptionGoroutinesExecutionTotal.WithLabelValues(result))
		if err != nil {
			return 0, err
		}
		done += v
	}
	return started - done - h.preemptionsBefore, nil
}

// collectEvictions takes the pods the scheduler deleted in this step out of
// their gangs, records the loss, and queues each such gang's restart at the
// current instant (evPreempted). Background pods it deleted are recorded
// apart (they are no job's) and their budgets' status updated.
func (h *harness) collectEvictions(ctx context.Context) error {
	lost := map[*gangState]*measure.Eviction{}
	var others []string
	for _, name := range h.deletions.take() {
		g := h.podGang[name]
		if g == nil {
			others = append(others, name)
			continue
		}
		e := lost[g]
		if e == nil {
			e = &measure.Eviction{Gang: g.job.Name}
			lost[g] = e
		}
		e.Pods++
		if !g.cpuOnly[name] {
			e.GPUPods++
		}
		if node, ok := g.bound[name]; ok {
			e.GPUs += g.podGPUs(name)
			delete(g.bound, name)
			delete(h.nodePods[node], name)
		}
		delete(h.podGang, name)
		for i, p := range g.pods {
			if p == name {
				g.pods = append(g.pods[:i], g.pods[i+1:]...)
				break
			}
		}
	}
	gangs := make([]*gangState, 0, len(lost))
	for g := range lost {
		gangs = append(gangs, g)
	}
	sort.Slice(gangs, func(i, j int) bool { return gangs[i].job.Seq < gangs[j].job.Seq })
	for _, g := range gangs {
		e := lost[g]
		e.Partial = len(g.bound) > 0
		e.At = h.now
		h.rec.Evicted(*e)
		heap.Push(&h.events, event{at: h.now, kind: evPreempted, seq: g.job.Seq, gang: g, attempt: g.attempt})
	}
	return h.evictedBackground(ctx, others)
}

// restartPreempted stops what is left of a gang that lost members to
// preemption and resubmits it.
func (h *harness) restartPreempted(ctx context.Context, e event, arriving []*gangState) ([]*gangState, error) {
	g := e.gang
	if g.done || g.attempt != e.attempt {
		return arriving, nil
	}
	return h.restart(ctx, g, arriving)
}

// gpusBeyondFree is what the higher-priority jobs arriving now need beyond
// the GPUs free before they arrive (they share those in arrival order): no
// scheduler can place them evicting less.
func (h *harness) gpusBeyondFree(arriving []*gangState) int64 {
	s := h.sample()
	free := s.CapacityGPUs - s.HeldGPUs - h.bg.gpus
	var beyond int64
	for _, g := range arriving {
		if g.attempt > 0 || g.job.Priority <= h.lowestPriority {
			continue
		}
		need := int64(g.job.Workers) * g.job.GPUs
		take := min(free, need)
		free -= take
		beyond += need - take
	}
	return beyond
}

// histogramCount is a histogram's number of observations (0 while it is not
// registered: WorkloadPreemptionVictims needs GenericWorkload).
func histogramCount(h *k8smetrics.Histogram) float64 {
	if h == nil {
		return 0
	}
	if _, registered := h.ObserverMetric.(k8smetrics.Metric); !registered {
		return 0
	}
	n, err := testutil.GetHistogramMetricCount(h.ObserverMetric)
	if err != nil {
		return 0
	}
	return float64(n)
}
