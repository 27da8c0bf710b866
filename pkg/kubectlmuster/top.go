package kubectlmuster

import (
	"maps"
	"slices"
	"sort"

	"github.com/muster-sched/muster/pkg/gang"
)

// Domain is one topology domain in `kubectl muster top -o json`: the
// cluster, a zone, a rack or a node. Its fields are documented in
// docs/explain.md; they are only ever added to.
type Domain struct {
	// Level is cluster, a topology level's name (zone, rack) or node.
	Level string `json:"level"`
	Name  string `json:"name"`
	Nodes int    `json:"nodes"`
	// Unavailable nodes are cordoned or being reclaimed: their free GPUs
	// count in Free but no gang is placed there.
	Unavailable int `json:"unavailable"`
	// GPUs is allocatable; Held what bound pods request; Free the rest
	// (FreeSpot of it on preemptible nodes, FreeOnDemand on the others).
	GPUs         int64 `json:"gpus"`
	Held         int64 `json:"held"`
	Free         int64 `json:"free"`
	FreeSpot     int64 `json:"freeSpot"`
	FreeOnDemand int64 `json:"freeOnDemand"`
	// LargestGang is how many workers of WorkerGPUs GPUs each fit in the
	// domain now (GPUs only, on available nodes, one worker per slot).
	LargestGang int64    `json:"largestGang"`
	WorkerGPUs  int64    `json:"workerGPUs"`
	Children    []Domain `json:"children,omitempty"`
}

// topLevels are the levels top groups by, widest first: zone, then rack,
// when the options have them.
func topLevels(levels []gang.Level) []gang.Level {
	var out []gang.Level
	for _, name := range []string{"zone", "rack"} {
		for _, l := range levels {
			if l.Name == name && l.Label != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

// Top is the cluster's GPUs by zone, rack and node.
func Top(snap *Snapshot, opts Options) Domain {
	ix := newIndex(snap, opts)
	states := ix.nodeStates()
	levels := topLevels(opts.Levels)
	root := Domain{Level: "cluster", Name: "cluster", WorkerGPUs: opts.WorkerGPUs}
	idx := make([]int, len(states))
	for i := range idx {
		idx[i] = i
	}
	build(&root, states, idx, levels, opts.WorkerGPUs)
	return root
}

// build fills d from its nodes and groups them into children by the next
// level (the nodes themselves after the last).
func build(d *Domain, states []nodeState, nodes []int, levels []gang.Level, worker int64) {
	for _, i := range nodes {
		s := &states[i]
		d.Nodes++
		d.GPUs += s.allocGPUs
		d.Held += s.heldGPUs
		free := max(s.freeGPUs, 0)
		d.Free += free
		if s.spot {
			d.FreeSpot += free
		} else {
			d.FreeOnDemand += free
		}
		if s.unavailable() {
			d.Unavailable++
		} else if worker > 0 {
			d.LargestGang += free / worker
		}
	}
	if len(levels) == 0 {
		if d.Level == "node" {
			return
		}
		for _, i := range nodes {
			child := Domain{Level: "node", Name: states[i].node.Name, WorkerGPUs: worker}
			build(&child, states, []int{i}, nil, worker)
			d.Children = append(d.Children, child)
		}
		sort.Slice(d.Children, func(a, b int) bool { return d.Children[a].Name < d.Children[b].Name })
		return
	}
	level := levels[0]
	groups := map[string][]int{}
	for _, i := range nodes {
		v := states[i].node.Labels[level.Label]
		if v == "" {
			v = "(none)"
		}
		groups[v] = append(groups[v], i)
	}
	names := slices.Sorted(maps.Keys(groups))
	for _, name := range names {
		child := Domain{Level: level.Name, Name: name, WorkerGPUs: worker}
		build(&child, states, groups[name], levels[1:], worker)
		d.Children = append(d.Children, child)
	}
}
