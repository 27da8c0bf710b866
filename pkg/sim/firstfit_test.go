package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// None's first fit takes the next node with the GPUs free, from where the
// last search ended, skips nodes that are gone, fails when nothing fits,
// and gets back what a deleted member held.
func TestFirstFitPicksTheNextNodeWithRoom(t *testing.T) {
	plan := parsePlan(t, `
name: fit
cluster: {nodes: 3, gpusPerNode: 8, nodesPerRack: 3}
workload: {waves: [{duration: 1m, gangs: [3x8]}]}
`, 1)
	bg, err := newBackground(plan)
	require.NoError(t, err)
	exist := map[string]*nodeSpec{}
	for _, n := range plan.Nodes {
		exist[n.Name] = &nodeSpec{name: n.Name}
	}
	fit := newFirstFit(plan, bg)
	g := &gangState{job: &plan.Jobs[0], bound: map[string]string{}}
	n0, n1, n2 := plan.Nodes[0].Name, plan.Nodes[1].Name, plan.Nodes[2].Name

	got, err := fit.pick(g, "a", exist)
	require.NoError(t, err)
	assert.Equal(t, n0, got)
	delete(exist, n1) // reclaimed
	got, err = fit.pick(g, "b", exist)
	require.NoError(t, err)
	assert.Equal(t, n2, got, "the node that is gone is skipped")
	_, err = fit.pick(g, "c", exist)
	assert.Error(t, err, "every node that exists is full")

	fit.release(g, "a", n0)
	got, err = fit.pick(g, "c", exist)
	require.NoError(t, err)
	assert.Equal(t, n0, got, "a released node has room again")
}
