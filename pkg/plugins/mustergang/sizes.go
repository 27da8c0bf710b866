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
	p.nodes.mu.Lock()
	out["node views"] = len(p.nodes.kept)
	p.nodes.mu.Unlock()
	p.nodes.classes.mu.Lock()
	out["node classes"] = len(p.nodes.classes.byName)
	p.nodes.classes.mu.Unlock()
	p.failedPlans.mu.Lock()
	out["failed-plan records"] = len(p.failedPlans.latest)
	p.failedPlans.mu.Unlock()
	out["failed-plan queue"] = p.failedPlans.queue.Len()
	out["status queue"] = p.status.queue.Len()
	p.timers.mu.Lock()
	out["timers named"], out["timers live"] = len(p.timers.named), len(p.timers.live)
	p.timers.mu.Unlock()
	p.dra.mu.Lock()
	out["DRA slices"], out["DRA nodes"], out["DRA node domains"] = len(p.dra.slices), len(p.dra.byNode), 0
	for _, nodes := range p.dra.domains {
		out["DRA node domains"] += len(nodes)
	}
	p.dra.mu.Unlock()
	return out
}
