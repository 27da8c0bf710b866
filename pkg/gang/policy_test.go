package gang

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPolicyExcludesAndDislikes is the whole meaning of the four policies:
// which node kinds each keeps a gang off and which it only ranks last.
func TestPolicyExcludesAndDislikes(t *testing.T) {
	type answer struct{ excludes, dislikes bool }
	for _, tc := range []struct {
		policy      Policy
		spot, onDem answer
	}{
		{PolicyForbid, answer{excludes: true}, answer{}},
		{PolicyAvoid, answer{dislikes: true}, answer{}},
		{PolicyPrefer, answer{}, answer{dislikes: true}},
		{PolicyRequire, answer{}, answer{excludes: true}},
	} {
		assert.Equal(t, tc.spot, answer{tc.policy.Excludes(true), tc.policy.Dislikes(true)}, "%s on a spot node", tc.policy)
		assert.Equal(t, tc.onDem, answer{tc.policy.Excludes(false), tc.policy.Dislikes(false)}, "%s on an on-demand node", tc.policy)
		assert.Equal(t, tc.spot.excludes || tc.onDem.excludes, tc.policy.KeepsOff(), "%s keeps pods off some nodes", tc.policy)
	}
}
