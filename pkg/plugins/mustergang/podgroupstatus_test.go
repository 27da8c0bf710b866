package mustergang

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// A PodGroup's phase counts the members that succeeded (gone from the
// informer) toward minMember, so a gang whose members finish one by one
// stays Running and ends Succeeded.
func TestPodGroupPhase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		last    v1alpha1.PodGroupPhase
		members memberCounts
		planned bool
		phase   v1alpha1.PodGroupPhase
		keep    bool
	}{
		{"no member placed", "", memberCounts{total: 3}, false, v1alpha1.PodGroupPending, false},
		{"planned", v1alpha1.PodGroupPending, memberCounts{total: 3}, true, v1alpha1.PodGroupScheduling, false},
		{"bound", v1alpha1.PodGroupScheduling, memberCounts{total: 3, bound: 3}, false, v1alpha1.PodGroupScheduled, false},
		{"running", v1alpha1.PodGroupScheduled, memberCounts{total: 3, bound: 3, running: 3}, false, v1alpha1.PodGroupRunning, false},
		{"one finished, two running", v1alpha1.PodGroupRunning, memberCounts{total: 2, bound: 2, running: 2, succeeded: 1}, false, v1alpha1.PodGroupRunning, false},
		{"one finished, its replacement bound", v1alpha1.PodGroupRunning, memberCounts{total: 3, bound: 3, running: 2, succeeded: 1}, false, v1alpha1.PodGroupRunning, false},
		{"every member succeeded", v1alpha1.PodGroupRunning, memberCounts{succeeded: 3}, false, v1alpha1.PodGroupSucceeded, false},
		{"members gone, not all succeeded", v1alpha1.PodGroupRunning, memberCounts{succeeded: 1}, false, v1alpha1.PodGroupRunning, true},
		{"members deleted after binding", v1alpha1.PodGroupScheduled, memberCounts{}, false, v1alpha1.PodGroupScheduled, true},
		{"short of members", v1alpha1.PodGroupPending, memberCounts{total: 2, bound: 2, running: 2}, false, v1alpha1.PodGroupPending, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			phase, keep := podGroupPhase(tc.last, 3, tc.members, tc.planned)
			assert.Equal(t, tc.phase, phase)
			assert.Equal(t, tc.keep, keep)
		})
	}
}
