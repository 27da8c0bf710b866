//go:build e2e

package integration

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/muster-sched/muster/pkg/gang"
	"github.com/muster-sched/muster/pkg/kubectlmuster"
)

// The real Kueue v0.17.0 in front of muster: a Job over the ClusterQueue's
// GPU quota stays suspended, and `kubectl muster explain` says so with
// Kueue's own words from the Job's Workload (LocalQueue, ClusterQueue, how
// much quota is missing), and that muster's planner would place it once
// admitted.
func TestE2EKubectlMusterKueue(t *testing.T) {
	c := startE2ECluster(t, gpuNodes(4, 2)...)
	c.startKueue()
	c.createQueues(kueueFlavor{name: "default-flavor", gpus: 4})

	c.createQueuedJob("first", 4)
	c.waitAdmittedAndBound("first", 4)
	c.createQueuedJob("second", 4)
	c.waitPending("second")

	ex := c.waitExplained("job/second", gang.PhaseSuspended, map[string]string{
		kubectlmuster.FindingSuspended: "pending admission in LocalQueue team of ClusterQueue gpu: ",
		kubectlmuster.FindingFitsNow:   "once resumed",
	})
	require.NotNil(t, ex.Gang.Kueue)
	assert.Equal(t, "team", ex.Gang.Kueue.LocalQueue)
	assert.Equal(t, "gpu", ex.Gang.Kueue.ClusterQueue)
	assert.True(t, strings.HasPrefix(ex.Gang.Kueue.Workload, "job-second-"), "Workload %q", ex.Gang.Kueue.Workload)
	assert.False(t, ex.Gang.Kueue.QuotaReserved)
	assert.Contains(t, ex.Gang.Kueue.Message, "insufficient", "Kueue's QuotaReserved message")

	out, err := c.kubectlMuster(c.Kubeconfig, "explain", "job/second")
	require.NoError(t, err)
	t.Logf("kubectl muster explain job/second:\n%s", out)
	out, err = c.kubectlMuster(c.Kubeconfig, "gangs")
	require.NoError(t, err)
	assert.Regexp(t, `job/first\s+4/4\s+Bound`, out)
	assert.Regexp(t, `job/second\s+0/4\s+Suspended`, out)
}
