package kubectlmuster

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/gang"
)

var (
	kueueWorkloads   = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
	kueueLocalQueues = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
)

// withKueue serves Kueue's v1beta2 Workloads and LocalQueues from objs in
// the fake cluster.
func (f *fakeCluster) withKueue(t *testing.T, objs ...runtime.Object) {
	t.Helper()
	disco := f.kube.Discovery().(*fakediscovery.FakeDiscovery)
	disco.Resources = append(disco.Resources, &metav1.APIResourceList{
		GroupVersion: "kueue.x-k8s.io/v1beta2",
		APIResources: []metav1.APIResource{{Name: "workloads", Namespaced: true, Kind: "Workload"},
			{Name: "localqueues", Namespaced: true, Kind: "LocalQueue"}},
	})
	f.dynamic = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kueueWorkloads: "WorkloadList", kueueLocalQueues: "LocalQueueList",
	}, objs...)
}

// kueueWorkloadObj is a Workload Kueue made for the Job named job, pending
// for quota as Kueue v0.17 words it.
func kueueWorkloadObj(job, uid, queue, message string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{
			"namespace": testNS, "name": "job-" + job + "-1a2b3",
			"ownerReferences": []any{map[string]any{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "controller": true}},
		},
		"spec": map[string]any{"queueName": queue},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message,
			"lastTransitionTime": "2026-12-02T11:59:00Z",
		}}},
	}}
}

func localQueueObj(name, clusterQueue string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
		"metadata": map[string]any{"namespace": testNS, "name": name},
		"spec":     map[string]any{"clusterQueue": clusterQueue},
	}}
}

func TestKueueSuspendedJob(t *testing.T) {
	queued := job("queued", 2, 8).Label(KueueQueueLabel, "team").Obj()
	queued.Spec.Suspend = ptr.To(true)
	orphan := job("orphan", 2, 8).Label(KueueQueueLabel, "team").Obj()
	orphan.Spec.Suspend = ptr.To(true)
	const quota = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 4 more needed"
	objs := append(nodeObjects(rackNodes(1, 2, 8)), queued, orphan)

	t.Run("Workload pending for quota", func(t *testing.T) {
		f := newFakeCluster(t, false, nil, objs...)
		f.withKueue(t, kueueWorkloadObj("queued", "uid-queued", "team", quota), localQueueObj("team", "gpu"))
		out, stderr, err := f.run(testNS, "explain", "job/queued", "-o", "json")
		require.NoError(t, err, stderr)
		var ex Explanation
		require.NoError(t, json.Unmarshal([]byte(out), &ex), out)
		assert.Equal(t, gang.PhaseSuspended, ex.Gang.Phase)
		assert.Equal(t, &Kueue{LocalQueue: "team", ClusterQueue: "gpu", Workload: "job-queued-1a2b3", Message: quota}, ex.Gang.Kueue)
		assert.True(t, hasFindingT(ex.Findings, FindingSuspended,
			"suspended by Kueue: Workload job-queued-1a2b3 pending admission in LocalQueue team of ClusterQueue gpu: "+quota), "%+v", ex.Findings)
		assert.True(t, hasFindingT(ex.Findings, FindingFitsNow, "once resumed"), "%+v", ex.Findings)
	})

	t.Run("Kueue served but no Workload for the Job", func(t *testing.T) {
		f := newFakeCluster(t, false, nil, objs...)
		f.withKueue(t, kueueWorkloadObj("queued", "uid-queued", "team", quota))
		out, stderr, err := f.run(testNS, "explain", "job/orphan")
		require.NoError(t, err, stderr)
		assert.Contains(t, out, "has made no Workload for it: is Kueue running and managing batch/job?")
	})

	t.Run("a Workload of an earlier Job of the same name is not this Job's", func(t *testing.T) {
		f := newFakeCluster(t, false, nil, objs...)
		f.withKueue(t, kueueWorkloadObj("queued", "uid-of-an-earlier-queued", "team", quota))
		out, stderr, err := f.run(testNS, "gangs", "-o", "json")
		require.NoError(t, err, stderr)
		var list GangList
		require.NoError(t, json.Unmarshal([]byte(out), &list), out)
		for _, g := range list.Items {
			if g.Name == "queued" {
				assert.Equal(t, &Kueue{LocalQueue: "team"}, g.Kueue)
			}
		}
	})

	t.Run("Workloads forbidden: a note, the label alone", func(t *testing.T) {
		f := newFakeCluster(t, false, nil, objs...)
		f.withKueue(t)
		f.dynamic.PrependReactor("list", "workloads", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "kueue.x-k8s.io", Resource: "workloads"}, "", errors.New("RBAC"))
		})
		out, stderr, err := f.run(testNS, "explain", "job/queued")
		require.NoError(t, err)
		assert.Contains(t, stderr, `note: you may not list workloads.kueue.x-k8s.io in namespace "team-a": Kueue's view of suspended Jobs is skipped`)
		assert.Contains(t, out, "suspended: Kueue has not admitted it yet (label kueue.x-k8s.io/queue-name=team; Kueue's Workloads are not read here)")
	})
}

func hasFindingT(findings []Finding, reason, text string) bool {
	for _, f := range findings {
		if f.Reason == reason && strings.Contains(f.Message, text) {
			return true
		}
	}
	return false
}
