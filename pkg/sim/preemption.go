package sim

import (
	"context"
	"sort"

	"github.com/muster-sched/muster/pkg/sim/measure"
)

// Preemption in the simulator. A scheduler preempts by deleting pods through
// the API (in a goroutine of its own, after the scheduling cycle). The
// simulator tells those deletions from its own by name: it announces every
// pod it deletes itself (deletions, reactors.go). A step is not settled
// while an eviction goroutine runs (metrics.go). After the step, each gang
// that lost members is stopped whole and resubmitted at the same virtual
// instant, as a MultiWorkerMirroredStrategy job that lost a worker fails
// and is rerun by its Job.

// collectEvictions takes the pods the scheduler deleted in this step out of
// their gangs, records the loss, and queues each such gang's restart at the
// current instant (evPreempted). Background pods it deleted are recorded
// apart (they are no job's) and their budgets' status updated.
func (c *cluster) collectEvictions(ctx context.Context) error {
	lost := map[*gangState]*measure.Eviction{}
	var others []string
	for _, name := range c.deletions.take() {
		g := c.work.podGang[name]
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
			c.nodes.unbind(node, name)
		}
		delete(c.work.podGang, name)
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
		e.At = c.eng.now
		c.rec.Evicted(*e)
		c.eng.push(event{at: c.eng.now, kind: evPreempted, seq: g.job.Seq, gang: g, attempt: g.attempt})
	}
	return c.evictedBackground(ctx, others)
}

// gpusBeyondFree is what the higher-priority jobs arriving now need beyond
// the GPUs free before they arrive (they share those in arrival order): no
// scheduler can place them evicting less.
func (c *cluster) gpusBeyondFree(arriving []*gangState) int64 {
	s := c.sample()
	free := s.CapacityGPUs - s.HeldGPUs - c.bg.gpus
	var beyond int64
	for _, g := range arriving {
		if g.attempt > 0 || g.job.Priority <= c.work.lowestPriority {
			continue
		}
		need := int64(g.job.Workers) * g.job.GPUs
		take := min(free, need)
		free -= take
		beyond += need - take
	}
	return beyond
}
