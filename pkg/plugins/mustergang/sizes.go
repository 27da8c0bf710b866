package mustergang

import "maps"

// Sizes counts what the plugin keeps, structure by structure, for a
// scheduler that runs for months (the simulator's soak samples it every
// virtual day): the gang manager's (shared by the scheduler's profiles),
// the topology index's and node views', the writers' queues and records,
// the timers, and the DRA cache's. Each is keyed by a gang, pod, node,
// domain or slice, and is dropped when that object leaves, or bounded by
// the objects present. The evictor keeps nothing keyed: what it deletes
// is marked on the pods themselves.
func (p *Plugin) Sizes() map[string]int {
	out := p.gangs.Sizes()
	maps.Copy(out, p.nodes.topology.Sizes())
	p.nodes.sizes(out)
	p.failedPlans.sizes(out)
	out["status queue"] = p.status.queue.Len()
	out["pending members' facts"] = p.source.facts.len()
	p.timers.sizes(out)
	p.dra.sizes(out)
	p.provisioning.sizes(out)
	return out
}

func (n *nodeViews) sizes(out map[string]int) {
	n.mu.Lock()
	out["node views"] = len(n.kept)
	n.mu.Unlock()
	n.classes.mu.Lock()
	out["node classes"] = len(n.classes.byName)
	n.classes.mu.Unlock()
}

func (w *failedPlanWriter) sizes(out map[string]int) {
	w.mu.Lock()
	out["failed-plan records"] = len(w.latest)
	w.mu.Unlock()
	out["failed-plan queue"] = w.queue.Len()
}

func (t *timers) sizes(out map[string]int) {
	t.mu.Lock()
	out["timers named"], out["timers live"] = len(t.named), len(t.live)
	t.mu.Unlock()
}

func (d *draGPUs) sizes(out map[string]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out["DRA slices"], out["DRA nodes"], out["DRA node domains"] = len(d.slices), len(d.byNode), 0
	for _, nodes := range d.domains {
		out["DRA node domains"] += len(nodes)
	}
}
