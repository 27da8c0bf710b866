package kubectlmuster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// fakeCluster is a fake API server with objs and the namespace of the tests;
// withPodGroups serves the scheduler-plugins PodGroup CRD with groups.
type fakeCluster struct {
	kube    *fake.Clientset
	dynamic *dynamicfake.FakeDynamicClient
}

func newFakeCluster(t testing.TB, withPodGroups bool, groups []v1alpha1.PodGroup, objs ...runtime.Object) *fakeCluster {
	t.Helper()
	objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}})
	kube := fake.NewClientset(objs...)
	var unstructuredGroups []runtime.Object
	for i := range groups {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&groups[i])
		require.NoError(t, err)
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
		u.SetKind("PodGroup")
		unstructuredGroups = append(unstructuredGroups, u)
	}
	if withPodGroups {
		kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
			GroupVersion: v1alpha1.SchemeGroupVersion.String(),
			APIResources: []metav1.APIResource{{Name: "podgroups", Namespaced: true, Kind: "PodGroup"}},
		}}
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "PodGroupList"}, unstructuredGroups...)
	return &fakeCluster{kube: kube, dynamic: dyn}
}

// run runs kubectl-muster args in namespace ns against the fake cluster.
func (f *fakeCluster) run(ns string, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := newCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, func() (Clients, string, error) {
		return Clients{Kube: f.kube, Dynamic: f.dynamic}, ns, nil
	})
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func objects[T any](items []T, ptr func(*T) runtime.Object) []runtime.Object {
	out := make([]runtime.Object, 0, len(items))
	for i := range items {
		out = append(out, ptr(&items[i]))
	}
	return out
}

func nodeObjects(nodes []corev1.Node) []runtime.Object {
	return objects(nodes, func(n *corev1.Node) runtime.Object { return n })
}

func podObjects(pods []corev1.Pod) []runtime.Object {
	return objects(pods, func(p *corev1.Pod) runtime.Object { return p })
}

func TestCommandGangsJSON(t *testing.T) {
	mnist := job("mnist", 2, 8).Obj()
	pg, pgPods := podGroup("pg", 2, 2, 4)
	objs := append(nodeObjects(rackNodes(1, 2, 8)), podObjects(concat(members(mnist, 2, "r1-n1", "r1-n2"), pgPods))...)
	f := newFakeCluster(t, true, []v1alpha1.PodGroup{pg}, append(objs, mnist)...)

	out, stderr, err := f.run(testNS, "gangs", "-o", "json")
	require.NoError(t, err, stderr)
	var list GangList
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	assert.Equal(t, APIVersion, list.APIVersion)
	assert.Equal(t, "GangList", list.Kind)
	require.Len(t, list.Items, 2, out)
	byRef := map[string]Gang{}
	for _, g := range list.Items {
		byRef[g.Ref()] = g
	}
	assert.Equal(t, gang.PhaseBound, byRef["job/mnist"].Phase)
	assert.Equal(t, []string{"r1-n1", "r1-n2"}, byRef["job/mnist"].Nodes)
	assert.Equal(t, gang.PhasePending, byRef["podgroup/pg"].Phase, "both members exist, muster has said nothing yet")
	assert.Equal(t, int64(8), byRef["podgroup/pg"].GPUs)
	assert.Equal(t, "note: scheduling.k8s.io/v1beta1 is not served (GenericWorkload off): Kubernetes PodGroups are skipped\n", stderr,
		"one note: every kind is served but Kubernetes' own PodGroups")
}

func TestCommandBadInput(t *testing.T) {
	mnist := job("mnist", 1, 8).Obj()
	objs := append(nodeObjects(rackNodes(1, 1, 8)), podObjects(members(mnist, 1))...)
	objs = append(objs, mnist)

	cases := []struct {
		name    string
		ns      string
		args    []string
		crd     bool
		forbid  string // resource whose list is forbidden
		wantErr string
		stderr  string
	}{{
		name: "namespace that does not exist", ns: "nope", args: []string{"gangs"},
		wantErr: `namespace "nope" not found`,
	}, {
		name: "forbidden list", ns: testNS, args: []string{"gangs"}, forbid: "jobs",
		wantErr: `forbidden: you may not list jobs.batch in namespace "team-a" (verb "list" on resource "jobs.batch"; ClusterRole muster-viewer grants it)`,
	}, {
		name: "forbidden cluster-wide pods for explain", ns: testNS, args: []string{"explain", "job/mnist"}, forbid: "pods",
		wantErr: `you may not list pods in any namespace`,
	}, {
		name: "unknown name, closest match", ns: testNS, args: []string{"explain", "job/mnsit"}, crd: true,
		wantErr: `not found: job "mnsit" in namespace "team-a"; did you mean job/mnist?`,
	}, {
		name: "unknown kind", ns: testNS, args: []string{"explain", "jbo/mnist"},
		wantErr: `unknown kind "jbo"; did you mean job?`,
	}, {
		name: "unknown output", ns: testNS, args: []string{"gangs", "-o", "xml"},
		wantErr: `unknown output format "xml"`,
	}, {
		name: "topology level without a label", ns: testNS, args: []string{"gangs", "--topology-levels", "host=kubernetes.io/hostname,block"},
		wantErr: `--topology-levels: level "block" is not NAME=NODE_LABEL`,
	}, {
		name: "topology level twice", ns: testNS, args: []string{"gangs", "--topology-levels", "block=example.com/block,block=example.com/pod"},
		wantErr: `--topology-levels: topologyLevels[1].name: Duplicate value: "block"`,
	}, {
		name: "unknown topology preset", ns: testNS, args: []string{"gangs", "--topology-preset", "azure"},
		wantErr: `unknown topology preset "azure" (known: default, gke, aws, topograph)`,
	}, {
		name: "PodGroup CRD not installed: said once, on stderr", ns: testNS, args: []string{"gangs"},
		stderr: "note: podgroups.scheduling.x-k8s.io is not served (the PodGroup CRD is not installed): scheduler-plugins PodGroups are skipped\n" +
			"note: scheduling.k8s.io/v1beta1 is not served (GenericWorkload off): Kubernetes PodGroups are skipped\n",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster(t, tc.crd, nil, objs...)
			if tc.forbid != "" {
				f.kube.PrependReactor("list", tc.forbid, func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: tc.forbid}, "", errors.New("RBAC"))
				})
			}
			_, stderr, err := f.run(tc.ns, tc.args...)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.stderr, stderr)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestCommandTopAndExplainText(t *testing.T) {
	busy := job("busy", 3, 8).Obj()
	waiting := job("waiting", 2, 8).Obj()
	nodes := rackNodes(2, 2, 8)
	pods := concat(members(busy, 3, "r1-n1", "r1-n2", "r2-n1"), members(waiting, 2))
	f := newFakeCluster(t, true, nil, append(append(nodeObjects(nodes), podObjects(pods)...), busy, waiting)...)

	out, _, err := f.run(testNS, "top")
	require.NoError(t, err)
	assert.Contains(t, out, "FITS 8-GPU WORKERS")
	assert.Regexp(t, `(?m)^cluster\s+4\s+32\s+24\s+8\s+0\s+8\s+0\s+1$`, out, "4 nodes, 32 GPUs, 24 held, 8 free on-demand, room for 1 worker")
	assert.Regexp(t, `(?m)^    rack r2\s+2\s+16\s+8\s+8\s`, out)
	assert.NotContains(t, out, "node r1-n1", "nodes only with -o wide")
	wide, _, err := f.run(testNS, "top", "-o", "wide")
	require.NoError(t, err)
	assert.Contains(t, wide, "node r2-n2")

	out, _, err = f.run(testNS, "explain", "job/waiting")
	require.NoError(t, err)
	assert.Regexp(t, `Gang:\s+job/waiting in namespace team-a`, out)
	assert.Contains(t, out, "needs 1 more node with 8 free nvidia.com/gpu; the cluster has room for 1 of 2 members")
	assert.Contains(t, out, "would fit if gang team-a/job/busy (priority 0, 24 nvidia.com/gpu) were preempted: this gang's priority 0 does not allow it")
}

func TestCommandTakesTheClustersOwnTopologyLevels(t *testing.T) {
	// muster configured with topologyLevels of its own: a gang asking for a
	// level no preset has is explained with them.
	nodes := rackNodes(2, 2, 8)
	for i := range nodes {
		nodes[i].Labels["example.com/block"] = "b" + nodes[i].Name[1:2] // r1-* in b1, r2-* in b2
	}
	busy := job("busy", 2, 8).Obj()
	waiting := job("waiting", 2, 8).PodAnnotation(gang.AnnotationTopologyRequired, "block").Obj()
	pods := concat(members(busy, 2, "r1-n1", "r2-n1"), members(waiting, 2))
	f := newFakeCluster(t, true, nil, append(append(nodeObjects(nodes), podObjects(pods)...), busy, waiting)...)
	levels := []string{"--topology-levels", "host=kubernetes.io/hostname,block=example.com/block"}

	out, _, err := f.run(testNS, append([]string{"explain", "job/waiting"}, levels...)...)
	require.NoError(t, err)
	assert.Contains(t, out, "needs 1 more node with 8 free nvidia.com/gpu in one block; block b1 has room for 1 of 2 members")

	out, _, err = f.run(testNS, "explain", "job/waiting")
	require.NoError(t, err)
	assert.Contains(t, out, `unknown topology level (known: node, nvlink, rack, zone)`, "the default preset has no block")
}
