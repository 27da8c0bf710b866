package sim

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// Spot churn in the cluster model: a reclaim notice taints nodes, which
// are deleted a notice period later and replaced some time after.

// notice taints the nodes filling the event's spot slots; they are deleted
// Notice later.
func (c *cluster) notice(ctx context.Context, e event) error {
	churn := c.plan.Scenario.Churn
	for _, slot := range e.reclaim.Slots {
		name := c.nodes.slots[slot]
		if name == "" {
			continue // already reclaimed and not yet replaced
		}
		node, err := c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, reclaimTaint())
		c.counts.want(kindNodeUpdate)
		if _, err := c.cs.CoreV1().Nodes().Update(ctx, versioned(c.resourceVersion, node), metav1.UpdateOptions{}); err != nil {
			return err
		}
		c.nodes.slots[slot] = ""
		c.changes.tainted = append(c.changes.tainted, name)
		c.eng.after(churn.Notice.Duration, event{kind: evDelete, seq: e.seq, node: name, slot: slot})
	}
	return nil
}

// deleteNode removes a reclaimed node. Every gang with a pod on it loses the
// whole gang (a MultiWorkerMirroredStrategy job cannot go on without a
// peer): its pods are deleted and it is resubmitted in this step.
func (c *cluster) deleteNode(ctx context.Context, e event, arriving []*gangState) ([]*gangState, error) {
	var broken []*gangState
	seen := map[*gangState]bool{}
	pods := make([]string, 0, len(c.nodes.pods[e.node]))
	for pod := range c.nodes.pods[e.node] {
		pods = append(pods, pod)
	}
	sort.Strings(pods)
	for _, pod := range pods {
		if g := c.work.podGang[pod]; g != nil && !seen[g] {
			seen[g] = true
			broken = append(broken, g)
		}
	}
	for _, g := range broken {
		c.rec.Broken(g.job.Name, c.eng.now)
		var err error
		if arriving, err = c.restart(ctx, g, arriving); err != nil {
			return nil, err
		}
	}
	bgPods, err := c.deleteBackgroundOn(ctx, e.node)
	if err != nil {
		return nil, err
	}
	c.counts.want(kindNodeDelete)
	if err := c.cs.CoreV1().Nodes().Delete(ctx, e.node, metav1.DeleteOptions{}); err != nil {
		return nil, err
	}
	spec := c.nodes.remove(e.node)
	if spec.dra {
		if err := c.deleteSlice(ctx, e.node); err != nil {
			return nil, err
		}
	}
	if after := c.plan.Scenario.Churn.ReplaceAfter.Duration; after > 0 {
		c.eng.after(after, event{kind: evReplace, seq: e.seq, slot: e.slot, generation: spec.generation + 1, background: bgPods})
	}
	return arriving, nil
}

// replaceNode adds a new spot node where a reclaimed one was (same rack and
// zone, a new name).
func (c *cluster) replaceNode(ctx context.Context, e event) error {
	var orig scenario.Node
	for _, n := range c.plan.Nodes {
		if n.Slot == e.slot {
			orig = n
		}
	}
	spec := &nodeSpec{name: fmt.Sprintf("%s-g%d", orig.Name, e.generation), rack: orig.Rack, zone: orig.Zone, gpus: orig.GPUs,
		spot: true, dra: orig.DRA, slot: e.slot, generation: e.generation}
	c.counts.want(kindNodeAdd)
	c.nodesReplaced++
	nodeCPU, nodeMemory := c.nodeResources(spec.gpus)
	if _, err := c.cs.CoreV1().Nodes().Create(ctx, versioned(c.resourceVersion, nodeObject(*spec, nodeCPU, nodeMemory)), metav1.CreateOptions{}); err != nil {
		return err
	}
	if spec.dra {
		// The driver publishes the new node's GPUs once it runs there.
		if err := c.createSlice(ctx, spec.name, spec.gpus); err != nil {
			return err
		}
	}
	c.nodes.add(spec)
	c.nodes.slots[e.slot] = spec.name
	return c.recreateBackground(ctx, e.background, spec.name)
}
