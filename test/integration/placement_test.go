package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// fill binds a pod that uses gpus on node directly (no scheduler), like a
// workload that was already running.
func (c *cluster) fill(node string, gpus int64) {
	c.t.Helper()
	pod := testobj.MakePod(c.ns, "").GenerateName("filler-").PodSpec(testobj.WorkerPodSpec("none", gpus)).Node(node).Obj()
	if _, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, pod, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func racksOf(c *cluster, pods []corev1.Pod) map[string]int {
	out := map[string]int{}
	for _, p := range pods {
		node, err := c.Client.CoreV1().Nodes().Get(c.ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		out[node.Labels[configv1.LabelRack]]++
	}
	return out
}

func TestTopologyTightestDomain(t *testing.T) {
	t.Run("gang lands in the rack that holds it whole", func(t *testing.T) {
		c := startCluster(t, testobj.Cluster(2, 4, 1, 8)...)
		c.addBackground(4, testobj.Cluster(2, 4, 1, 8)...)
		c.fill("r1-n1", 8)
		c.fill("r1-n2", 8)
		c.createJob(jobSpec{name: "big", workers: 4, gpus: 8})
		pods := c.waitJobBound("big", 4)
		if racks := racksOf(c, pods); racks["r2"] != 4 {
			t.Errorf("gang placed over racks %v, want all 4 in r2", racks)
		}
	})

	t.Run("topology-required rack waits while unconstrained gang spans racks", func(t *testing.T) {
		c := startCluster(t, testobj.Cluster(2, 4, 1, 8)...)
		for _, n := range []string{"r1-n1", "r1-n2", "r2-n1", "r2-n2"} {
			c.fill(n, 8)
		}
		c.createJob(jobSpec{name: "strict", workers: 4, gpus: 8, annotations: map[string]string{"muster.dev/topology-required": "rack"}})
		c.waitJobUnschedulable("strict", 4, "in one rack (topology-required)", "at most 2 fit (in rack")
		c.createJob(jobSpec{name: "relaxed", workers: 4, gpus: 8})
		pods := c.waitJobBound("relaxed", 4)
		if racks := racksOf(c, pods); racks["r1"] != 2 || racks["r2"] != 2 {
			t.Errorf("relaxed gang placed over %v, want 2 per rack", racks)
		}
		if n := countBound(c.jobPods("strict")); n != 0 {
			t.Errorf("strict gang has %d bound members", n)
		}
	})

	t.Run("small workers share one node", func(t *testing.T) {
		c := startCluster(t, testobj.Cluster(1, 4, 1, 8)...)
		c.createJob(jobSpec{name: "small", workers: 4, gpus: 2})
		pods := c.waitJobBound("small", 4)
		if nodes := nodesOf(pods); len(nodes) != 1 {
			t.Errorf("4 × 2-GPU gang spread over %v, want one node", nodes)
		}
	})
}

const defaultSchedulerConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
`

// fragmentation submits the same seeded stream of small gangs to a cluster
// of 8 × 8-GPU nodes and returns how many nodes are left whole.
func fragmentation(t *testing.T, scheduler string) (*cluster, int) {
	c := startCluster(t, testobj.Cluster(2, 4, 1, 8)...)
	if scheduler != schedulerName {
		ctx, cancel := context.WithCancel(c.ctx)
		done, err := c.StartSchedulerWithConfig(ctx, []byte(defaultSchedulerConfig))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); <-done })
	}
	rng := rand.New(rand.NewPCG(2026, 11))
	total := 0
	for i := 0; total < 28; i++ {
		workers, gpus := 1+rng.IntN(2), int64(1+rng.IntN(2))
		total += int(workers) * int(gpus)
		name := fmt.Sprintf("small-%d", i)
		c.createJob(jobSpec{name: name, workers: int32(workers), gpus: gpus, scheduler: scheduler})
		c.waitJobBound(name, workers)
	}
	used := map[string]int64{}
	pods, err := c.Client.CoreV1().Pods(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		q := p.Spec.Containers[0].Resources.Limits[configv1.DefaultGPUResourceName]
		used[p.Spec.NodeName] += q.Value()
	}
	whole := 0
	for _, n := range testobj.Cluster(2, 4, 1, 8) {
		if used[n.Name] == 0 {
			whole++
		}
	}
	return c, whole
}

// Many small gangs, then one that needs whole nodes: muster bin-packs and
// keeps whole nodes free where the default scheduler spreads.
func TestFragmentationAgainstDefaultScheduler(t *testing.T) {
	var defaultWhole int
	t.Run("default-scheduler", func(t *testing.T) {
		_, defaultWhole = fragmentation(t, "default-scheduler")
	})
	t.Run("muster", func(t *testing.T) {
		c, whole := fragmentation(t, schedulerName)
		t.Logf("whole free 8-GPU nodes after the same small gangs: muster %d, default-scheduler %d", whole, defaultWhole)
		if whole < 4 {
			t.Fatalf("muster left %d whole nodes, want at least 4 (28 GPUs fit in 4 nodes)", whole)
		}
		if defaultWhole >= whole {
			t.Errorf("default-scheduler left %d whole nodes, muster %d: no fragmentation advantage", defaultWhole, whole)
		}
		c.createJob(jobSpec{name: "large", workers: 4, gpus: 8})
		c.waitJobBound("large", 4)
	})
}

func spotNodes() []*corev1.Node {
	var nodes []*corev1.Node
	for i := range 4 {
		nodes = append(nodes,
			gpuNode(fmt.Sprintf("od-%d", i), 8).Rack("r1").Zone("z1").Obj(),
			gpuNode(fmt.Sprintf("spot-%d", i), 8).Rack("r2").Zone("z1").Spot().Obj())
	}
	return nodes
}

func spotCount(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if len(p.Spec.NodeName) > 4 && p.Spec.NodeName[:4] == "spot" {
			n++
		}
	}
	return n
}

func TestPreemptiblePolicy(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		wantSpot int
	}{{"", 0}, {"avoid", 0}, {"prefer", 4}, {"require", 4}, {"forbid", 0}} {
		t.Run("policy="+tc.policy, func(t *testing.T) {
			c := startCluster(t, spotNodes()...)
			var ann map[string]string
			if tc.policy != "" {
				ann = map[string]string{"muster.dev/preemptible": tc.policy}
			}
			c.createJob(jobSpec{name: "job", workers: 4, gpus: 8, annotations: ann})
			if got := spotCount(c.waitJobBound("job", 4)); got != tc.wantSpot {
				t.Errorf("policy %q put %d workers on spot nodes, want %d", tc.policy, got, tc.wantSpot)
			}
		})
	}
	t.Run("on-demand busy: forbid waits, avoid uses spot", func(t *testing.T) {
		c := startCluster(t, spotNodes()...)
		for i := range 4 {
			c.fill(fmt.Sprintf("od-%d", i), 8)
		}
		c.createJob(jobSpec{name: "forbid", workers: 4, gpus: 8, annotations: map[string]string{"muster.dev/preemptible": "forbid"}})
		c.waitJobUnschedulable("forbid", 4, "policy forbid excludes 4 preemptible nodes")
		c.createJob(jobSpec{name: "avoid", workers: 4, gpus: 8})
		if got := spotCount(c.waitJobBound("avoid", 4)); got != 4 {
			t.Errorf("avoid put %d workers on spot, want 4 (on-demand is full)", got)
		}
	})
}

func TestReclaimingNodeGetsNoMember(t *testing.T) {
	nodes := gpuNodes(3, 8)
	nodes = append(nodes, gpuNode("node-4", 8).Rack("r1").
		Taint(corev1.Taint{Key: configv1.TaintGKEImpendingTermination, Effect: corev1.TaintEffectNoSchedule}).Obj())
	c := startCluster(t, nodes...)
	c.createJob(jobSpec{name: "gang", workers: 4, gpus: 8})
	c.waitJobUnschedulable("gang", 4, "1 nodes are being reclaimed or cordoned", "at most 3 fit")
	if held := c.holdingPods(); len(held) != 0 {
		t.Errorf("pods hold nodes: %v", held)
	}
}

func TestBadAnnotationsAreExplained(t *testing.T) {
	c := startCluster(t, gpuNodes(2, 8)...)
	c.createJob(jobSpec{name: "badlevel", workers: 2, gpus: 1, annotations: map[string]string{"muster.dev/topology-required": "pod"}})
	c.createJob(jobSpec{name: "badpolicy", workers: 2, gpus: 1, annotations: map[string]string{"muster.dev/preemptible": "sometimes"}})
	c.createJob(jobSpec{name: "badmin", workers: 2, gpus: 1, annotations: map[string]string{"muster.dev/min-available": "5"}})
	c.waitJobUnschedulable("badlevel", 2, `invalid muster.dev/topology-required "pod": unknown topology level`)
	c.waitJobUnschedulable("badpolicy", 2, `invalid muster.dev/preemptible "sometimes"`)
	c.waitJobUnschedulable("badmin", 2, "invalid muster.dev/min-available 5")
	c.waitForEvent("Job", "badlevel", "GangInvalid", "unknown topology level")
	if held := c.holdingPods(); len(held) != 0 {
		t.Errorf("pods with bad annotations hold nodes: %v", held)
	}
}

func TestInvalidPluginArgsRejectedAtStartup(t *testing.T) {
	cp := controlplane.Start(t)
	config := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: muster
  plugins:
    multiPoint:
      enabled:
      - name: MusterGang
  pluginConfig:
  - name: MusterGang
    args:
      defaultScheduleTimeoutSeconds: 3600
      topologyLevels:
      - {name: rack, nodeLabel: topology.kubernetes.io/rack}
      - {name: rack, nodeLabel: example.com/rack}
`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done, err := cp.StartSchedulerWithConfig(ctx, []byte(config))
	if err == nil {
		cancel()
		<-done
		t.Fatal("scheduler started with invalid MusterGang args")
	}
	for _, want := range []string{"defaultScheduleTimeoutSeconds", "topologyLevels[1].name: Duplicate value"} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
