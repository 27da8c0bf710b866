package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// The gangs' lives in the cluster model: their objects are created when
// they arrive, and deleted when they complete or are restarted; bindings
// are applied to them after each step.

// complete ends a gang whose job finished: its pods, Job and PodGroup go.
func (c *cluster) complete(ctx context.Context, e event) error {
	g := e.gang
	if g.done || !g.running || g.attempt != e.attempt {
		return nil // a reclaim restarted the gang since
	}
	if err := c.deletePods(ctx, g); err != nil {
		return err
	}
	g.running, g.done = false, true
	g.jobObj = nil // a finished gang never runs again: a month keeps 100,000 of them otherwise
	c.work.finished++
	c.rec.Completed(g.job.Name, c.eng.now)
	c.counts.want(kindJobDelete)
	if err := c.cs.BatchV1().Jobs(namespace).Delete(ctx, g.job.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return c.deletePodGroup(ctx, g)
}

func (c *cluster) deletePodGroup(ctx context.Context, g *gangState) error {
	if !c.b.podGroups {
		return nil
	}
	c.counts.want(kindPodGroupDelete)
	return c.cs.SchedulingV1beta1().PodGroups(namespace).Delete(ctx, podGroupName(g.job, g.attempt), metav1.DeleteOptions{})
}

// deletePods deletes every pod of the gang's current attempt.
func (c *cluster) deletePods(ctx context.Context, g *gangState) error {
	for _, name := range g.pods {
		c.counts.want(kindPodDelete)
		c.deletions.mine(name)
		if err := c.cs.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting pod %s: %w", name, err)
		}
		ref := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID("pod-" + name)}}
		if node, ok := g.bound[name]; ok && c.work.fit != nil {
			c.work.fit.release(g, name, node)
		}
		if node, ok := g.bound[name]; ok {
			c.nodes.unbind(node, name)
			c.changes.deletedBound = append(c.changes.deletedBound, ref)
		} else {
			if c.b.podGroups {
				ref.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To(podGroupName(g.job, g.attempt))}
			}
			c.changes.deletedQueue = append(c.changes.deletedQueue, ref)
		}
		delete(c.work.podGang, name)
	}
	g.pods, g.bound, g.cpuOnly = nil, nil, nil // a month's finished gangs keep no map
	return nil
}

// restart stops every pod of the gang's current attempt and resubmits the
// gang as its next attempt in this step.
func (c *cluster) restart(ctx context.Context, g *gangState, arriving []*gangState) ([]*gangState, error) {
	if err := c.deletePods(ctx, g); err != nil {
		return nil, err
	}
	if err := c.deletePodGroup(ctx, g); err != nil {
		return nil, err
	}
	g.running = false
	g.attempt++
	return append(arriving, g), nil
}

// restartPreempted stops what is left of a gang that lost members to
// preemption and resubmits it.
func (c *cluster) restartPreempted(ctx context.Context, e event, arriving []*gangState) ([]*gangState, error) {
	g := e.gang
	if g.done || g.attempt != e.attempt {
		return arriving, nil
	}
	return c.restart(ctx, g, arriving)
}

// createPodGroups creates the native PodGroups of arriving gangs (first:
// pods whose PodGroup the scheduler has not seen wait apart).
func (c *cluster) createPodGroups(ctx context.Context, arriving []*gangState) error {
	for _, g := range arriving {
		c.counts.want(kindPodGroupAdd)
		pg := podGroupObject(g.job, g.attempt, c.eng.now, c.topologyKey(g.job))
		if _, err := c.cs.SchedulingV1beta1().PodGroups(namespace).Create(ctx, versioned(c.resourceVersion, pg), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// createPods creates every pod of arriving gangs with the step's
// scheduling gate, interleaved across gangs or job by job as the workload
// says (None binds each as it creates it).
func (c *cluster) createPods(ctx context.Context, arriving []*gangState) error {
	type podRef struct {
		g     *gangState
		index int
	}
	var refs []podRef
	for _, g := range arriving {
		if g.jobObj == nil {
			g.jobObj = jobObject(g.job, c.b.schedulerName, c.eng.now)
		}
		for i := 0; i < g.job.Members(); i++ {
			refs = append(refs, podRef{g, i})
		}
	}
	if c.plan.Scenario.Workload.PodOrder == "interleaved" {
		rng := rand.New(rand.NewPCG(c.plan.Seed, scenario.StreamPodOrder+c.eng.steps))
		rng.Shuffle(len(refs), func(i, j int) { refs[i], refs[j] = refs[j], refs[i] })
	}
	cpuMember := v1.ResourceList{v1.ResourceCPU: c.bg.memberCPU, v1.ResourceMemory: c.bg.memMem}
	for _, r := range refs {
		pod := podObject(r.g.job, r.g.jobObj, c.b, r.g.attempt, r.index, c.eng.now, cpuMember, c.plan.Scenario.Workload.AntiAffinity)
		if r.index >= r.g.job.Workers {
			if r.g.cpuOnly == nil {
				r.g.cpuOnly = map[string]bool{}
			}
			r.g.cpuOnly[pod.Name] = true
		}
		if c.work.fit != nil {
			node, err := c.work.fit.pick(r.g, pod.Name, c.nodes.byName)
			if err != nil {
				return err
			}
			pod.Spec.NodeName = node
			pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionTrue})
		}
		r.g.pods = append(r.g.pods, pod.Name)
		c.work.podGang[pod.Name] = r.g
		c.counts.want(kindPodAdd)
		if _, err := c.cs.CoreV1().Pods(namespace).Create(ctx, versioned(c.resourceVersion, pod), metav1.CreateOptions{}); err != nil {
			return err
		}
		if c.work.fit != nil {
			c.binds.add(bindRecord{pod: pod.Name, uid: pod.UID, node: pod.Spec.NodeName, at: time.Now()})
		}
		c.changes.created = append(c.changes.created, pod)
	}
	return nil
}

// createJobs creates the Jobs of arriving gangs (a restarted gang keeps
// its Job).
func (c *cluster) createJobs(ctx context.Context, arriving []*gangState) error {
	for _, g := range arriving {
		if g.attempt > 0 {
			continue
		}
		c.counts.want(kindJobAdd)
		if _, err := c.cs.BatchV1().Jobs(namespace).Create(ctx, versioned(c.resourceVersion, g.jobObj), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// collectBinds applies the bindings made since the last call to the gangs,
// and records every gang whose last member was bound. A gang's latency runs
// from the moment the scheduler was resumed in this step to its last
// binding. It returns how many bindings it applied and when the last one
// was made (zero: none).
func (c *cluster) collectBinds(resumedAt time.Time) (int, time.Time) {
	records := c.work.bindsApplied.unread()
	c.work.bindsApplied.read(len(records))
	lastBind := map[*gangState]time.Time{}
	var touched []*gangState
	var latest time.Time
	for _, r := range records {
		g := c.work.podGang[r.pod]
		if g == nil {
			continue // deleted since (cannot happen: the reactor checks)
		}
		if _, ok := lastBind[g]; !ok {
			touched = append(touched, g)
		}
		if g.bound == nil {
			g.bound = map[string]string{}
		}
		g.bound[r.pod] = r.node
		c.nodes.bind(r.node, r.pod)
		lastBind[g] = r.at
		if r.at.After(latest) {
			latest = r.at
		}
	}
	for _, g := range touched {
		if g.running || len(g.bound) < g.job.Members() {
			continue
		}
		g.running = true
		c.eng.push(event{at: c.eng.now + g.job.Duration, kind: evComplete, seq: g.job.Seq, gang: g, attempt: g.attempt})
		// None's binds (firstFit) happen as the pods are created,
		// before the step resumes any scheduler: no scheduler latency.
		latency := max(lastBind[g].Sub(resumedAt), 0)
		c.rec.Placed(g.job.Name, c.eng.now, latency, c.placement(g))
	}
	return len(records), latest
}
