package mustergang

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The facts planning keeps of each pending member follow the pod: kept for
// the object gathered, computed again for an updated object (its new
// requests counted), and dropped when the member is bound or deleted.
func TestPendingFactsFollowTheirPod(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{a, b})
	_, status := f.preFilter(t, a)
	require.False(t, status.IsSuccess(), "two members of 8 GPUs fit on one node of 8")
	assert.Equal(t, 2, f.plugin.source.facts.len(), "facts of both pending members")
	kept, err := f.plugin.source.facts.of(a)
	require.NoError(t, err)
	assert.Same(t, a, kept.pod)

	// b asks for 4 GPUs now: a new object, new facts.
	smaller := b.DeepCopy()
	smaller.Spec.Containers[0].Resources.Requests["nvidia.com/gpu"] = resource.MustParse("4")
	smaller.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("4")
	require.NoError(t, f.plugin.source.pods.Update(smaller))
	f.plugin.onPodUpdate(b, smaller)
	facts, err := f.plugin.source.facts.of(smaller)
	require.NoError(t, err)
	assert.Same(t, smaller, facts.pod)
	assert.Equal(t, int64(4), facts.info.CalculateResource().Resource.GetScalarResources()["nvidia.com/gpu"])

	bound := a.DeepCopy()
	bound.Spec.NodeName = "n1"
	require.NoError(t, f.plugin.source.pods.Update(bound))
	f.plugin.onPodUpdate(a, bound)
	assert.Equal(t, 1, f.plugin.source.facts.len(), "a bound member's facts are kept")

	require.NoError(t, f.plugin.source.pods.Delete(smaller))
	f.plugin.onPodDelete(smaller)
	assert.Zero(t, f.plugin.source.facts.len(), "a deleted member's facts are kept")
}
