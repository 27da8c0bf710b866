package gang

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const gpu v1.ResourceName = "nvidia.com/gpu"

var defaultLevels = []Level{
	{Name: "node", Label: "kubernetes.io/hostname"},
	{Name: "nvlink", Label: "nvidia.com/gpu.clique"},
	{Name: "rack", Label: "topology.kubernetes.io/rack"},
	{Name: "zone", Label: "topology.kubernetes.io/zone"},
}

// testNode is an 8-GPU node in a rack (and zone z1) with usedGPUs taken.
type testNode struct {
	name, rack string
	gpus, used int64
	spot       bool
	reclaiming bool
	cordoned   bool
	taints     []v1.Taint
}

func views(nodes ...testNode) []NodeView {
	out := make([]NodeView, len(nodes))
	for i, n := range nodes {
		gpus := n.gpus
		if gpus == 0 {
			gpus = 8
		}
		labels := map[string]string{"kubernetes.io/hostname": n.name, "topology.kubernetes.io/zone": "z1"}
		if n.rack != "" {
			labels["topology.kubernetes.io/rack"] = n.rack
		}
		out[i] = NewNodeView(
			&v1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels},
				Spec:       v1.NodeSpec{Taints: n.taints, Unschedulable: n.cordoned},
			},
			Resources{MilliCPU: 64000, Memory: 1 << 40, Pods: 110, Scalars: map[v1.ResourceName]int64{gpu: gpus - n.used}},
			gpu, n.spot, n.reclaiming)
	}
	return out
}

// TestNodeViewKeepsGPUsAndCordon: a view made by NewNodeView and one
// written as a literal plan alike; Take keeps the view's free GPUs right
// and leaves the shared Free alone; a cordoned node is never used.
func TestNodeViewKeepsGPUsAndCordon(t *testing.T) {
	// Only the cordoned c could take both members on one node.
	made := views(testNode{name: "a", rack: "r1", used: 3}, testNode{name: "b", rack: "r1", used: 5}, testNode{name: "c", rack: "r1", cordoned: true})
	literal := make([]NodeView, len(made))
	for i, v := range made {
		literal[i] = NodeView{Node: v.Node, Free: v.Free, Preemptible: v.Preemptible, Cordoned: v.Cordoned}
	}
	for name, nodes := range map[string][]NodeView{"NewNodeView": made, "literal": literal} {
		plan, err := Compute(request(gangOf(2, 3)), nodes)
		require.NoError(t, err, name)
		assert.Equal(t, map[string]int{"a": 1, "b": 1}, nodesUsed(plan), "%s: the rack's a and b, never the cordoned c", name)
	}

	shared := made[0].Free
	made[0].Take(Resources{Scalars: map[v1.ResourceName]int64{gpu: 4}})
	assert.Equal(t, int64(1), made[0].gpus(gpu))
	assert.Equal(t, int64(5), shared.Scalars[gpu], "the shared Free is not written")
	_, err := Compute(request(gangOf(1, 3)), made[:1])
	assert.Error(t, err, "the taken GPUs are gone for the planner")
}

func rackNodes(rack string, n int, used ...int64) []testNode {
	var out []testNode
	for i := range n {
		tn := testNode{name: fmt.Sprintf("%s-n%d", rack, i+1), rack: rack}
		if i < len(used) {
			tn.used = used[i]
		}
		out = append(out, tn)
	}
	return out
}

func gangOf(n int, gpus int64) []Member {
	shared := &NodeConstraints{}
	members := make([]Member, n)
	for i := range members {
		members[i] = Member{
			UID:         types.UID(fmt.Sprintf("uid-%d", i)),
			Name:        fmt.Sprintf("w-%d", i),
			Request:     Resources{MilliCPU: 1000, Pods: 1, Scalars: map[v1.ResourceName]int64{gpu: gpus}},
			Constraints: shared,
		}
	}
	return members
}

func request(members []Member, mutate ...func(*Request)) Request {
	r := Request{Gang: "ns/job", Members: members, Needed: len(members), GPU: gpu, Levels: defaultLevels, Policy: PolicyAvoid}
	for _, m := range mutate {
		m(&r)
	}
	return r
}

// nodesUsed maps node name → members placed on it.
func nodesUsed(p *Plan) map[string]int {
	out := map[string]int{}
	for _, n := range p.Slots {
		out[n]++
	}
	return out
}

func racksOf(p *Plan) map[string]bool {
	out := map[string]bool{}
	for _, n := range p.Slots {
		out[strings.SplitN(n, "-", 2)[0]] = true
	}
	return out
}

func TestComputeTopology(t *testing.T) {
	tests := []struct {
		name       string
		nodes      []testNode
		req        Request
		wantLevel  string
		wantDomain string
		wantNodes  int
		wantErr    string
	}{
		{
			name:       "small workers share one node",
			nodes:      append(rackNodes("r1", 4), rackNodes("r2", 4)...),
			req:        request(gangOf(4, 2)),
			wantLevel:  "node",
			wantDomain: "r1-n1", // all nodes tie at 8 free: lowest name
			wantNodes:  1,
		},
		{
			name:       "best fit among nodes: the node with the least room that fits",
			nodes:      []testNode{{name: "a", rack: "r1"}, {name: "b", rack: "r1", used: 4}, {name: "c", rack: "r1", used: 2}},
			req:        request(gangOf(2, 2)),
			wantLevel:  "node",
			wantDomain: "b", // 4 free, needs 4: leftover 0
			wantNodes:  1,
		},
		{
			name:       "gang goes to the rack that fits it whole",
			nodes:      append(rackNodes("r1", 4, 8, 8), rackNodes("r2", 4)...),
			req:        request(gangOf(4, 8)),
			wantLevel:  "rack",
			wantDomain: "r2",
			wantNodes:  4,
		},
		{
			name:       "best fit among racks: fewest GPUs left over",
			nodes:      append(rackNodes("r1", 4), rackNodes("r2", 3)...),
			req:        request(gangOf(3, 8)),
			wantLevel:  "rack",
			wantDomain: "r2",
			wantNodes:  3,
		},
		{
			name:       "equal racks break ties by name",
			nodes:      append(rackNodes("r2", 4), rackNodes("r1", 4)...),
			req:        request(gangOf(4, 8)),
			wantLevel:  "rack",
			wantDomain: "r1",
			wantNodes:  4,
		},
		{
			name:      "required rack with two free nodes per rack waits",
			nodes:     append(rackNodes("r1", 4, 8, 8), rackNodes("r2", 4, 8, 8)...),
			req:       request(gangOf(4, 8), func(r *Request) { r.Required = "rack" }),
			wantErr:   "needs 4 members of 8 nvidia.com/gpu in one rack (topology-required); at most 2 fit (in rack r1)",
			wantLevel: "",
		},
		{
			name:       "without the requirement the same gang spans racks",
			nodes:      append(rackNodes("r1", 4, 8, 8), rackNodes("r2", 4, 8, 8)...),
			req:        request(gangOf(4, 8)),
			wantLevel:  "zone",
			wantDomain: "z1",
			wantNodes:  4,
		},
		{
			name:       "preferred rack starts at rack level",
			nodes:      append(rackNodes("r1", 4), rackNodes("r2", 2)...),
			req:        request(gangOf(2, 2), func(r *Request) { r.Preferred = "rack" }),
			wantLevel:  "rack",
			wantDomain: "r2", // 16 free beats 32 free for 4 GPUs
			wantNodes:  1,
		},
		{
			name:      "unknown level is an error",
			nodes:     rackNodes("r1", 2),
			req:       request(gangOf(1, 1), func(r *Request) { r.Required = "pod" }),
			wantErr:   `unknown topology level "pod"`,
			wantLevel: "",
		},
		{
			name:      "nodes without the rack label form no rack",
			nodes:     []testNode{{name: "x"}, {name: "y"}},
			req:       request(gangOf(2, 8), func(r *Request) { r.Required = "rack" }),
			wantErr:   "none fit",
			wantLevel: "",
		},
		{
			name:       "quorum below gang size places the quorum",
			nodes:      rackNodes("r1", 3),
			req:        request(gangOf(4, 8), func(r *Request) { r.Needed = 3 }),
			wantLevel:  "rack",
			wantDomain: "r1",
			wantNodes:  3,
		},
		{
			name: "untolerated taint keeps members off a node",
			nodes: append(rackNodes("r1", 2), testNode{name: "r1-tainted", rack: "r1",
				taints: []v1.Taint{{Key: "dedicated", Value: "other", Effect: v1.TaintEffectNoSchedule}}}),
			req:        request(gangOf(3, 8)),
			wantErr:    "at most 2 fit",
			wantDomain: "",
		},
	}
	// Every case is planned twice: with a fresh topology index, and with one
	// index shared by all cases (as a scheduler profile shares one between
	// plans and cluster changes), twice over the same node objects.
	shared := NewTopologyIndex(request(nil).Levels)
	for _, tc := range tests {
		nodes := views(tc.nodes...)
		for _, index := range []string{"fresh", "shared", "shared again"} {
			t.Run(tc.name+"/"+index, func(t *testing.T) {
				req := tc.req
				if index != "fresh" {
					req.Topology = shared
				}
				checkComputeTopology(t, req, nodes, tc.wantLevel, tc.wantDomain, tc.wantNodes, tc.wantErr)
			})
		}
	}
}

func checkComputeTopology(t *testing.T, req Request, nodes []NodeView, wantLevel, wantDomain string, wantNodes int, wantErr string) {
	t.Helper()
	plan, err := Compute(req, nodes)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Compute() error = %v, want one containing %q (plan %+v)", err, wantErr, plan)
		}
		return
	}
	if err != nil {
		t.Fatalf("Compute() error = %v", err)
	}
	if plan.Level != wantLevel || plan.Domain != wantDomain {
		t.Errorf("placed in %s %s, want %s %s", plan.Level, plan.Domain, wantLevel, wantDomain)
	}
	if got := len(nodesUsed(plan)); got != wantNodes || plan.Nodes != wantNodes {
		t.Errorf("gang uses %d nodes (plan says %d), want %d: %v", got, plan.Nodes, wantNodes, plan.Slots)
	}
	if len(plan.Slots) != req.Needed && len(plan.Slots) != len(req.Members) {
		t.Errorf("plan places %d members, want %d or %d", len(plan.Slots), req.Needed, len(req.Members))
	}
}

func TestComputeIsDeterministic(t *testing.T) {
	nodes := views(append(rackNodes("r1", 8, 3, 5, 1), rackNodes("r2", 8, 6, 2)...)...)
	first, err := Compute(request(gangOf(6, 2)), nodes)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		again, err := Compute(request(gangOf(6, 2)), nodes)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(again.Slots) != fmt.Sprint(first.Slots) {
			t.Fatalf("plans differ: %v vs %v", first.Slots, again.Slots)
		}
	}
}

// 4 spot and 4 on-demand 8-GPU nodes, spot in rack "spot", on-demand in "od".
func spotCluster(odUsed int64) []testNode {
	var nodes []testNode
	for i := range 4 {
		nodes = append(nodes, testNode{name: fmt.Sprintf("od-n%d", i), rack: "od", used: odUsed})
		nodes = append(nodes, testNode{name: fmt.Sprintf("spot-n%d", i), rack: "spot", spot: true})
	}
	return nodes
}

func TestComputePreemptiblePolicy(t *testing.T) {
	tests := []struct {
		policy   Policy
		odUsed   int64
		wantRack string
		wantErr  string
	}{
		{policy: PolicyAvoid, wantRack: "od"},
		{policy: PolicyPrefer, wantRack: "spot"},
		{policy: PolicyRequire, wantRack: "spot"},
		{policy: PolicyForbid, wantRack: "od"},
		{policy: PolicyForbid, odUsed: 8, wantErr: "4 eligible nodes have 0 free nvidia.com/gpu; policy forbid excludes 4 preemptible nodes"},
		{policy: PolicyAvoid, odUsed: 8, wantRack: "spot"},
		{policy: PolicyRequire, odUsed: 8, wantRack: "spot"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/on-demand-used-%d", tc.policy, tc.odUsed), func(t *testing.T) {
			plan, err := Compute(request(gangOf(4, 8), func(r *Request) { r.Policy = tc.policy }), views(spotCluster(tc.odUsed)...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if racks := racksOf(plan); len(racks) != 1 || !racks[tc.wantRack] {
				t.Errorf("placed on %v, want only rack %s", plan.Slots, tc.wantRack)
			}
		})
	}
}

// With on-demand and spot nodes mixed in every rack, avoid widens to a
// domain with enough on-demand nodes rather than mixing in a tighter one.
func TestComputeAvoidPrefersFewerSpotOverTighterDomain(t *testing.T) {
	var nodes []testNode
	for r := 1; r <= 2; r++ {
		for i := range 4 {
			nodes = append(nodes, testNode{name: fmt.Sprintf("r%d-n%d", r, i), rack: fmt.Sprintf("r%d", r), spot: i >= 2})
		}
	}
	plan, err := Compute(request(gangOf(4, 8)), views(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	if plan.PreemptibleNodes != 0 {
		t.Errorf("avoid used %d spot nodes (%v), want 0: four on-demand nodes exist across the zone", plan.PreemptibleNodes, plan.Slots)
	}
	// With topology-required rack, the gang must stay in one rack and
	// uses as few spot nodes as that allows.
	plan, err = Compute(request(gangOf(4, 8), func(r *Request) { r.Required = "rack" }), views(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Level != "rack" || plan.PreemptibleNodes != 2 {
		t.Errorf("required rack: placed in %s %s with %d spot nodes, want one rack with 2", plan.Level, plan.Domain, plan.PreemptibleNodes)
	}
}

func TestComputeNeverUsesReclaimingNodes(t *testing.T) {
	nodes := rackNodes("r1", 3)
	nodes = append(nodes, testNode{name: "r1-going", rack: "r1", reclaiming: true})
	_, err := Compute(request(gangOf(4, 8)), views(nodes...))
	if err == nil || !strings.Contains(err.Error(), "at most 3 fit") {
		t.Fatalf("error = %v, want the gang to wait (the only fourth node is being reclaimed)", err)
	}
	plan, err := Compute(request(gangOf(3, 8)), views(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	if _, used := nodesUsed(plan)["r1-going"]; used {
		t.Errorf("plan uses the reclaiming node: %v", plan.Slots)
	}
}

func TestParsePolicy(t *testing.T) {
	for value, want := range map[string]Policy{"": PolicyAvoid, "forbid": PolicyForbid, "avoid": PolicyAvoid, "prefer": PolicyPrefer, "require": PolicyRequire} {
		if got, err := ParsePolicy(value); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", value, got, err, want)
		}
	}
	for _, bad := range []string{"Avoid", "spot", "yes"} {
		if _, err := ParsePolicy(bad); err == nil || !strings.Contains(err.Error(), "must be one of forbid, avoid, prefer, require") {
			t.Errorf("ParsePolicy(%q) error = %v, want a clear rejection", bad, err)
		}
	}
}

func TestComputeOneWorkerPerNode(t *testing.T) {
	members := gangOf(3, 2)
	onePerNode := &NodeConstraints{OnePerNode: true}
	for i := range members {
		members[i].Constraints = onePerNode
	}
	plan, err := Compute(request(members), views(rackNodes("r1", 4)...))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(nodesUsed(plan)); got != 3 {
		t.Errorf("anti-affine members share nodes: %v", plan.Slots)
	}
}

func withFailedIndexes(job *batchv1.Job, indexes string) *batchv1.Job {
	job.Spec.BackoffLimitPerIndex = ptr.To[int32](0)
	job.Status.FailedIndexes = &indexes
	return job
}

// quorumPod is a gang member with the min-available annotation, or none
// when minAvailable is "".
func quorumPod(minAvailable string) *v1.Pod {
	p := &v1.Pod{}
	if minAvailable != "" {
		p.Annotations = map[string]string{AnnotationMinAvailable: minAvailable}
	}
	return p
}

func TestJobQuorum(t *testing.T) {
	job := func(parallelism, completions, succeeded int32) *batchv1.Job {
		return &batchv1.Job{Spec: batchv1.JobSpec{Parallelism: &parallelism, Completions: &completions}, Status: batchv1.JobStatus{Succeeded: succeeded}}
	}
	tests := []struct {
		name    string
		job     *batchv1.Job
		pod     *v1.Pod
		want    int
		wantErr string
	}{
		{"parallelism", job(4, 4, 0), quorumPod(""), 4, ""},
		{"capped by completions left", job(4, 8, 6), quorumPod(""), 2, ""},
		{"all done but one replacement", job(4, 4, 4), quorumPod(""), 1, ""},
		{"lowered by annotation", job(4, 4, 0), quorumPod("3"), 3, ""},
		{"annotation above parallelism", job(4, 4, 0), quorumPod("5"), 0, "the Job runs at most 4 pods at once"},
		{"annotation equal to parallelism after a member succeeded", job(4, 4, 1), quorumPod("4"), 3, ""},
		{"indexes failed for good are not waited for", withFailedIndexes(job(4, 4, 0), "0,2-3"), quorumPod(""), 1, ""},
		{"failed indexes without backoffLimitPerIndex are retried", func() *batchv1.Job {
			j := withFailedIndexes(job(4, 4, 0), "1")
			j.Spec.BackoffLimitPerIndex = nil
			return j
		}(), quorumPod(""), 4, ""},
		{"annotation zero", job(4, 4, 0), quorumPod("0"), 0, "must be a positive integer"},
		{"annotation not a number", job(4, 4, 0), quorumPod("three"), 0, "must be a positive integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := JobQuorum(tc.job, tc.pod)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("JobQuorum = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestStatefulSetQuorum(t *testing.T) {
	sts := func(replicas int32, policy appsv1.PodManagementPolicyType) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: &replicas, PodManagementPolicy: policy}}
	}
	tests := []struct {
		name        string
		sts         *appsv1.StatefulSet
		pod         *v1.Pod
		want        int
		wantOrdered bool
		wantErr     string
	}{
		{"parallel: replicas", sts(3, appsv1.ParallelPodManagement), quorumPod(""), 3, false, ""},
		{"parallel: lowered by annotation", sts(4, appsv1.ParallelPodManagement), quorumPod("2"), 2, false, ""},
		{"parallel: annotation above replicas", sts(2, appsv1.ParallelPodManagement), quorumPod("3"), 0, false, "has 2 replicas"},
		{"parallel: scaled to zero still places a pod it meets", sts(0, appsv1.ParallelPodManagement), quorumPod(""), 1, false, ""},
		{"ordered ready: one at a time", sts(3, appsv1.OrderedReadyPodManagement), quorumPod(""), 1, true, ""},
		{"default policy is ordered ready", sts(3, ""), quorumPod("3"), 1, true, ""},
		{"annotation not a number", sts(3, appsv1.ParallelPodManagement), quorumPod("x"), 0, false, "must be a positive integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ordered, err := StatefulSetQuorum(tc.sts, tc.pod)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || ordered != tc.wantOrdered {
				t.Errorf("StatefulSetQuorum = %d, %v, %v; want %d, %v", got, ordered, err, tc.want, tc.wantOrdered)
			}
		})
	}
}

// refusingChecker stands in for the framework's filters: it refuses the
// listed (member, node) pairs and records what it was asked, and what one
// trial asked or placed more than once.
type refusingChecker struct {
	refuse map[string]bool // "member/node"
	asked  []string
	again  []string
	trials int
}

func (c *refusingChecker) Trial() Trial {
	c.trials++
	return &refusingTrial{c: c, asked: map[string]bool{}, placed: map[string]bool{}}
}

type refusingTrial struct {
	c             *refusingChecker
	asked, placed map[string]bool
}

func (t *refusingTrial) Fits(m *Member, node *v1.Node) bool {
	pair := m.Name + "/" + node.Name
	t.c.asked = append(t.c.asked, pair)
	if t.asked[pair] {
		t.c.again = append(t.c.again, pair)
	}
	t.asked[pair] = true
	return !t.c.refuse[pair] && !t.c.refuse["*/"+node.Name]
}

func (t *refusingTrial) Assign(m *Member, node *v1.Node) {
	if t.placed[m.Name] {
		t.c.again = append(t.c.again, "placed "+m.Name+" again on "+node.Name)
	}
	t.placed[m.Name] = true
}

func TestCheckerRefusalMovesMemberToNextBestNode(t *testing.T) {
	// Three nodes with 4 free GPUs each: best fit puts w-0 on r1-n1 and w-1
	// on r1-n2; the filters refuse w-1 on r1-n2 (say, anti-affinity with a
	// pod there), so w-1 goes to r1-n3.
	req := request(gangOf(2, 4))
	check := &refusingChecker{refuse: map[string]bool{"w-1/r1-n2": true}}
	req.Check = check
	plan, err := Compute(req, views(rackNodes("r1", 3, 4, 4, 4)...))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Slots["uid-0"] != "r1-n1" || plan.Slots["uid-1"] != "r1-n3" {
		t.Errorf("slots %v, want uid-0 on r1-n1 and uid-1 on r1-n3", plan.Slots)
	}
	// Only the nodes the planner would take are asked about: one per
	// member, plus the refused one.
	if len(check.asked) != 3 {
		t.Errorf("asked %v, want 3 checks", check.asked)
	}
}

// TestFiltersConfirmTheScreenedPlacement: a screened placement the filters
// accept member by member is the plan, and a refusal resumes placing after
// the accepted members. A filter refusing fixed (member, node) pairs is the
// same rule as a required node affinity keeping each member off those
// nodes, which the screening evaluates itself: both must give the same
// plan, and no trial asks the filters about a pair twice.
func TestFiltersConfirmTheScreenedPlacement(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 2))
	planned, refusedSome := 0, 0
	for round := range 400 {
		var nodes []testNode
		for r := range 1 + rng.IntN(4) {
			for i := range 1 + rng.IntN(6) {
				nodes = append(nodes, testNode{name: fmt.Sprintf("r%d-n%d", r, i), rack: fmt.Sprintf("r%d", r), used: int64(rng.IntN(9))})
			}
		}
		members := gangOf(1+rng.IntN(8), int64(1+rng.IntN(8)))
		refuse := map[string]bool{}
		avoiding := make([]Member, len(members))
		for i, m := range members {
			var off []string
			for _, n := range nodes {
				if rng.IntN(5) == 0 {
					refuse[m.Name+"/"+n.name] = true
					off = append(off, n.name)
				}
			}
			avoiding[i] = m
			avoiding[i].Constraints = ConstraintsOf(klog.Background(), podAvoiding(off))
		}
		want, wantErr := Compute(request(avoiding), views(nodes...))
		check := &refusingChecker{refuse: refuse}
		got, gotErr := Compute(request(members, func(r *Request) { r.Check = check }), views(nodes...))
		require.Equal(t, wantErr == nil, gotErr == nil, "round %d: with affinity %v, with filters %v", round, wantErr, gotErr)
		assert.Equal(t, want, got, "round %d", round)
		assert.Empty(t, check.again, "round %d: asked again in one trial", round)
		if got != nil {
			planned++
		}
		if check.trials > 0 && len(check.asked) > len(members) {
			refusedSome++
		}
	}
	// The rounds must exercise both outcomes and the resumption.
	assert.Greater(t, planned, 50)
	assert.Greater(t, refusedSome, 50)
}

// podAvoiding is a pod that requires a node not named in names.
func podAvoiding(names []string) *v1.Pod {
	pod := &v1.Pod{}
	if len(names) > 0 {
		pod.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpNotIn, Values: names}},
			}}},
		}}
	}
	return pod
}

func TestCheckerRefusingEveryNodeLeavesNoPlan(t *testing.T) {
	req := request(gangOf(2, 4))
	req.Check = &refusingChecker{refuse: map[string]bool{"w-1/r1-n1": true, "w-1/r1-n2": true}}
	if _, err := Compute(req, views(rackNodes("r1", 2)...)); err == nil {
		t.Fatal("planned a member on a node the filters refuse")
	}
}

func TestBoundMembersFixTheDomain(t *testing.T) {
	// Two members run in rack r2 (on r2-n1); the replacement must join
	// them in r2 under topology-required rack, although r1 is a better fit.
	nodes := append(rackNodes("r1", 1, 4), rackNodes("r2", 2, 8, 0)...)
	req := request(gangOf(1, 4))
	req.Required = "rack"
	req.BoundNodes = []string{"r2-n1", "r2-n1"}
	plan, err := Compute(req, views(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Slots["uid-0"]; got != "r2-n2" {
		t.Errorf("replacement on %s, want r2-n2 (rack r2 of the running members)", got)
	}
	if plan.Level != "rack" || plan.Domain != "r2" {
		t.Errorf("plan in %s %s, want rack r2", plan.Level, plan.Domain)
	}

	// Without room in the running members' rack there is no plan.
	full := append(rackNodes("r1", 1), rackNodes("r2", 2, 8, 8)...)
	if _, err := Compute(req, views(full...)); err == nil {
		t.Error("replacement planned outside its running members' rack")
	}

	// Preferred (or no) topology: the tightest level holding the running
	// members and the replacement; here the node level is impossible (the
	// running node is full), the rack level holds them.
	req.Required, req.Preferred = "", ""
	plan, err = Compute(req, views(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Level != "rack" || plan.Domain != "r2" {
		t.Errorf("plan in %s %s, want rack r2", plan.Level, plan.Domain)
	}
}

func TestBoundMembersInSeveralDomainsWidenTheLevel(t *testing.T) {
	nodes := append(rackNodes("r1", 2, 4), rackNodes("r2", 1, 4)...)
	req := request(gangOf(1, 4))
	req.BoundNodes = []string{"r1-n1", "r2-n1"}
	plan, err := Compute(req, views(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Level != "zone" {
		t.Errorf("plan at level %s, want zone (the running members span two racks)", plan.Level)
	}
}

// TestFiltersAskedOnlyForTheDomainThatFits: a gang of one-per-node workers
// fits in no single node, so no one-node domain is tried and the filters are
// asked about exactly the nodes of the plan (each was asked about every
// free node before, for the first member).
func TestFiltersAskedOnlyForTheDomainThatFits(t *testing.T) {
	members := gangOf(3, 1)
	onePerNode := &NodeConstraints{OnePerNode: true}
	for i := range members {
		members[i].Constraints = onePerNode
	}
	req := request(members)
	check := &refusingChecker{}
	req.Check = check
	plan, err := Compute(req, views(append(rackNodes("r1", 4), rackNodes("r2", 4)...)...))
	require.NoError(t, err)
	assert.Equal(t, "rack", plan.Level)
	assert.Len(t, check.asked, 3, "asked %v", check.asked)
}

// TestNameTiesFollowDomainsAddedLater: the topology index ranks domain
// names once and ranks again when a level gains a domain, so a node that
// joins later and sorts first wins a tie with the nodes already ranked.
func TestNameTiesFollowDomainsAddedLater(t *testing.T) {
	idx := NewTopologyIndex(defaultLevels)
	planOn := func(nodes []NodeView) map[string]int {
		plan, err := Compute(request(gangOf(1, 8), func(r *Request) { r.Topology = idx }), nodes)
		require.NoError(t, err)
		return nodesUsed(plan)
	}
	assert.Equal(t, map[string]int{"n2": 1}, planOn(views(testNode{name: "n3", rack: "r1"}, testNode{name: "n2", rack: "r1"})))
	assert.Equal(t, map[string]int{"n1": 1},
		planOn(views(testNode{name: "n3", rack: "r1"}, testNode{name: "n2", rack: "r1"}, testNode{name: "n1", rack: "r1"})),
		"n1, added after the names were ranked, sorts first")
}

// withCPUMember adds a member that asks for no GPU (a TFJob's PS).
func withCPUMember(members []Member, name string) []Member {
	return append(members, Member{
		UID:         types.UID("uid-" + name),
		Name:        name,
		Request:     Resources{MilliCPU: 2000, Pods: 1},
		Constraints: &NodeConstraints{},
	})
}

// TestGPULessMemberNeedsNoGPUSlot: two 8-GPU workers and a PS without GPU,
// rack required, on a rack with exactly two free 8-GPU nodes: the PS shares a
// worker's node. Counting the PS in GPU slots refused the rack ("at most 3
// fit" for a gang of 3).
func TestGPULessMemberNeedsNoGPUSlot(t *testing.T) {
	nodes := append(rackNodes("r1", 3, 8, 0, 0), rackNodes("r2", 3, 8, 8, 0)...)
	req := request(withCPUMember(gangOf(2, 8), "ps-0"), func(r *Request) { r.Required = "rack" })
	plan, err := Compute(req, views(nodes...))
	require.NoError(t, err)
	assert.Equal(t, "rack", plan.Level)
	assert.Equal(t, "r1", plan.Domain, "r1 is the rack with two free nodes")
	assert.Len(t, plan.Slots, 3)
	assert.Equal(t, 2, plan.Nodes, "the PS shares a worker's node")

	// Without a rack that has two free nodes, the message counts the GPU
	// workers and never claims the whole gang fits.
	_, err = Compute(req, views(append(rackNodes("r1", 2, 8, 0), rackNodes("r2", 2, 8, 0)...)...))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "needs 2 members of 8 nvidia.com/gpu and 1 of 2000m cpu in one rack (topology-required); at most 2 fit (in rack r1)")
}

// TestUnplaceableNeverSaysTheWholeGangFits: when the resources fit but the
// filters refuse, the message says so instead of "at most N fit" with N the
// gang's size.
func TestUnplaceableNeverSaysTheWholeGangFits(t *testing.T) {
	req := request(gangOf(2, 4))
	req.Check = &refusingChecker{refuse: map[string]bool{"w-1/r1-n1": true, "w-1/r1-n2": true}}
	_, err := Compute(req, views(rackNodes("r1", 2)...))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "at most 2 fit")
	assert.Contains(t, err.Error(), "their requests fit in the cluster, but not the scheduler's filters")
}

// TestUnplaceableSaysWhichNodesTheMembersMayNotUse: free GPUs behind a taint
// the members do not tolerate are counted, and the message says the members
// may not use those nodes, not only that none fit.
func TestUnplaceableSaysWhichNodesTheMembersMayNotUse(t *testing.T) {
	taint := v1.Taint{Key: "dedicated", Value: "training", Effect: v1.TaintEffectNoSchedule}
	nodes := views(testNode{name: "a", rack: "r1", taints: []v1.Taint{taint}}, testNode{name: "b", rack: "r1", taints: []v1.Taint{taint}},
		testNode{name: "c", rack: "r1", used: 8})
	_, err := Compute(request(gangOf(2, 8)), nodes)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "none fit; 3 eligible nodes have 16 free nvidia.com/gpu; 2 of them no member may use")

	tolerating := gangOf(2, 8)
	constraints := ConstraintsOf(klog.Background(), &v1.Pod{Spec: v1.PodSpec{Tolerations: []v1.Toleration{{Key: taint.Key, Value: taint.Value, Effect: taint.Effect}}}})
	for i := range tolerating {
		tolerating[i].Constraints = constraints
	}
	_, err = Compute(request(tolerating), nodes)
	require.NoError(t, err, "members that tolerate the taint use both nodes")
}
