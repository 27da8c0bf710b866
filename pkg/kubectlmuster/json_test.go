package kubectlmuster

import (
	"encoding/json"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/muster-sched/muster/pkg/gang"
)

// keys are the JSON field names of v, every field set, sorted.
func keys(t *testing.T, v any) []string {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m))
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// The -o json documents are an API (muster.dev/v1alpha1, documented field
// by field in docs/explain.md): fields are only added. A failure here is a
// change of that API: update docs/explain.md with it, and never rename or
// remove a field.
func TestJSONFieldsDocumented(t *testing.T) {
	now := metav1.NewTime(testNow)
	g := Gang{Kind: "Job", Namespace: "n", Name: "a", Members: 1, Gated: 1, Bound: 1, Quorum: 1, Phase: gang.PhaseBound, Since: &now,
		GPUs: 1, Priority: 1, Domain: "rack r1", Nodes: []string{"x"}, Reason: "r", Message: "m",
		Kueue: &Kueue{LocalQueue: "q", ClusterQueue: "c", Workload: "w", QuotaReserved: true, Admitted: true, Message: "m"}}
	assert.Equal(t, []string{"bound", "domain", "gated", "gpus", "kind", "kueue", "members", "message", "name", "namespace",
		"nodes", "phase", "priority", "quorum", "reason", "since"}, keys(t, g))
	assert.Equal(t, []string{"admitted", "clusterQueue", "localQueue", "message", "quotaReserved", "workload"}, keys(t, g.Kueue))
	assert.Equal(t, []string{"apiVersion", "items", "kind"}, keys(t, GangList{Items: []Gang{}}))

	ex := &Explanation{Gang: g,
		Constraints: Constraints{TopologyRequired: "rack", TopologyPreferred: "rack", Preemptible: "avoid", PreemptionPolicy: "Never"},
		Findings:    []Finding{{Reason: "r", Message: "m"}},
		Nodes:       []NodeCount{{Reason: "r", Message: "m", Nodes: 1, Examples: []string{"x"}}},
		Members:     []MemberState{{Name: "a", Node: "x", Nominated: "y", Domain: "rack r1", GPUs: 1, Gates: []string{"g"}, Message: "m"}},
		Events:      []EventNote{{Reason: "r", Message: "m", Count: 1, Last: &now}},
	}
	assert.Equal(t, []string{"apiVersion", "constraints", "events", "findings", "gang", "kind", "members", "nodes"},
		keys(t, ExplanationDocument{Explanation: ex}))
	assert.Equal(t, []string{"preemptible", "preemptionPolicy", "topologyPreferred", "topologyRequired"}, keys(t, ex.Constraints))
	assert.Equal(t, []string{"message", "reason"}, keys(t, ex.Findings[0]))
	assert.Equal(t, []string{"examples", "message", "nodes", "reason"}, keys(t, ex.Nodes[0]))
	assert.Equal(t, []string{"domain", "gates", "gpus", "message", "name", "node", "nominated"}, keys(t, ex.Members[0]))
	assert.Equal(t, []string{"count", "last", "message", "reason"}, keys(t, ex.Events[0]))

	d := Domain{Level: "cluster", Name: "cluster", Children: []Domain{{}}}
	assert.Equal(t, []string{"children", "free", "freeOnDemand", "freeSpot", "gpus", "held", "largestGang", "level", "name",
		"nodes", "unavailable", "workerGPUs"}, keys(t, d))
	assert.Equal(t, []string{"apiVersion", "cluster", "kind"}, keys(t, TopDocument{Cluster: d}))
}
