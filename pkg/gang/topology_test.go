package gang

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fleet that replaces its nodes every day (spot, autoscaling; node names
// never reused) keeps the index bounded: the node objects and the domains
// only they were in are forgotten, and a gang whose members run in a rack
// is still planned in that rack after the renumbering.
func TestTopologyIndexForgetsReplacedNodesAndTheirDomains(t *testing.T) {
	const fleet = 100
	idx := NewTopologyIndex(defaultLevels)
	var nodes []testNode
	for day := range 30 {
		nodes = nodes[:0]
		for i := range fleet {
			nodes = append(nodes, testNode{name: fmt.Sprintf("d%d-n%d", day, i), rack: fmt.Sprintf("r%d", i%4)})
		}
		req := request(gangOf(2, 8), func(r *Request) { r.Topology = idx; r.Required = "rack" })
		// A member runs on the day's node 3, in rack r3: the replacement joins it there.
		req.BoundNodes = []string{nodes[3].name}
		plan, err := Compute(req, views(nodes...))
		require.NoError(t, err, "day %d", day)
		assert.Equal(t, "r3", plan.Domain, "day %d: the running member's rack", day)

		idx.mu.Lock()
		objects, hostnames, racks := len(idx.nodes), len(idx.names[0]), len(idx.names[2])
		idx.mu.Unlock()
		bound := 2*fleet + 1024 + fleet
		assert.LessOrEqual(t, objects, bound, "day %d: node objects remembered", day)
		assert.LessOrEqual(t, hostnames, bound+1, "day %d: hostnames numbered", day)
		assert.LessOrEqual(t, racks, 5, "day %d: racks numbered (4 and none)", day)
	}
	idx.mu.Lock()
	defer idx.mu.Unlock()
	assert.Less(t, len(idx.names[0]), 30*fleet, "the hostnames of every day are still numbered")
}
