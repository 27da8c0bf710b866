package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// The realistic background (scenario.Background) in the fake cluster.
//
// Background pods are pods of priority 0 bound to their nodes
// before the scheduler starts: they go into the fake's tracker with the
// nodes, so the scheduler's informers list them and its cache and
// snapshot count their requests on their nodes from the first cycle. They
// live in a namespace of their own, are never jobs' (no job metric counts
// them) and never finish. Most ask for CPU and memory only; those of
// background.gpuPods hold GPUs as well (a busy cluster), and those of
// background.noisyPods carry the label app=scenario.NoisyApp that workers
// may avoid. What happens to them:
//
//   - The scheduler's preemption may delete one; the simulator records it
//     (measure.Recorder.BackgroundEvicted) and does not recreate it (no
//     controller runs).
//   - When a spot node is deleted, its background pods are deleted with it
//     (as the pod garbage collector does) and come back on its replacement
//     (the DaemonSet's pods, and the Deployment replicas recreated there).
//   - The status of each PodDisruptionBudget (the fake has no disruption
//     controller) is written at the start and again whenever a pod it
//     covers goes or comes, as the disruption controller would write it.

// backgroundNamespace holds the background pods and their budgets.
const backgroundNamespace = "background"

// backgroundLabel marks background pods.
const backgroundLabel = "sim.muster.dev/background"

// bgPod is a live background pod.
type bgPod struct {
	name, node, app, kind, pdb string
	// gpus it holds (gpuPods); noisy: a noisy pod (noisyPods).
	gpus  int64
	noisy bool
}

// bgPDB is a budget and how many of its pods are alive.
type bgPDB struct {
	spec    scenario.PDB
	healthy int
}

// background is the cluster model's record of the background.
type background struct {
	cpu, memory           resource.Quantity // of each pod of the pods block
	memberCPU, memMem     resource.Quantity // of each CPU-only gang member
	gpuCPU, gpuMemory     resource.Quantity // of a GPU pod, per GPU it holds
	noisyCPU, noisyMemory resource.Quantity // of each noisy pod
	pods                  map[string]*bgPod
	onNode                map[string]map[string]bool // node → background pod names
	pdbs                  map[string]*bgPDB
	// gpus are the GPUs the live background pods hold.
	gpus int64
}

func newBackground(plan *scenario.Plan) (*background, error) {
	b := &background{pods: map[string]*bgPod{}, onNode: map[string]map[string]bool{}, pdbs: map[string]*bgPDB{}}
	if bg := plan.Scenario.Background; bg != nil {
		var err error
		if p := bg.Pods; p != nil {
			if b.cpu, err = resource.ParseQuantity(p.CPU); err != nil {
				return nil, fmt.Errorf("background.pods.cpu: %w", err)
			}
			if b.memory, err = resource.ParseQuantity(p.Memory); err != nil {
				return nil, fmt.Errorf("background.pods.memory: %w", err)
			}
		}
		if m := bg.CPUMembers; m != nil {
			if b.memberCPU, err = resource.ParseQuantity(m.CPU); err != nil {
				return nil, fmt.Errorf("background.cpuMembers.cpu: %w", err)
			}
			if b.memMem, err = resource.ParseQuantity(m.Memory); err != nil {
				return nil, fmt.Errorf("background.cpuMembers.memory: %w", err)
			}
		}
		if g := bg.GPUPods; g != nil {
			if b.gpuCPU, err = resource.ParseQuantity(g.CPUPerGPU); err != nil {
				return nil, fmt.Errorf("background.gpuPods.cpuPerGPU: %w", err)
			}
			if b.gpuMemory, err = resource.ParseQuantity(g.MemoryPerGPU); err != nil {
				return nil, fmt.Errorf("background.gpuPods.memoryPerGPU: %w", err)
			}
		}
		if n := bg.NoisyPods; n != nil {
			if b.noisyCPU, err = resource.ParseQuantity(n.CPU); err != nil {
				return nil, fmt.Errorf("background.noisyPods.cpu: %w", err)
			}
			if b.noisyMemory, err = resource.ParseQuantity(n.Memory); err != nil {
				return nil, fmt.Errorf("background.noisyPods.memory: %w", err)
			}
		}
	}
	for _, p := range plan.PDBs {
		b.pdbs[p.Name] = &bgPDB{spec: p}
	}
	for _, p := range plan.Background {
		b.add(&bgPod{name: p.Name, node: p.Node, app: p.App, kind: p.Kind, pdb: p.PDB, gpus: p.GPUs, noisy: p.Noisy})
	}
	return b, nil
}

func (b *background) add(p *bgPod) {
	b.pods[p.name] = p
	if b.onNode[p.node] == nil {
		b.onNode[p.node] = map[string]bool{}
	}
	b.onNode[p.node][p.name] = true
	b.gpus += p.gpus
	if p.pdb != "" {
		b.pdbs[p.pdb].healthy++
	}
}

// remove forgets a background pod and returns it (nil if it is not one).
func (b *background) remove(name string) *bgPod {
	p := b.pods[name]
	if p == nil {
		return nil
	}
	delete(b.pods, name)
	delete(b.onNode[p.node], name)
	b.gpus -= p.gpus
	if p.pdb != "" {
		b.pdbs[p.pdb].healthy--
	}
	return p
}

// podsOn lists the background pods on node, sorted.
func (b *background) podsOn(node string) []*bgPod {
	names := slices.Sorted(maps.Keys(b.onNode[node]))
	out := make([]*bgPod, 0, len(names))
	for _, name := range names {
		out = append(out, b.pods[name])
	}
	return out
}

// gpusOn are the GPUs the background pods on node hold.
func (b *background) gpusOn(node string) int64 {
	var n int64
	for name := range b.onNode[node] {
		n += b.pods[name].gpus
	}
	return n
}

// noisyOn: a noisy pod runs on node.
func (b *background) noisyOn(node string) bool {
	for name := range b.onNode[node] {
		if b.pods[name].noisy {
			return true
		}
	}
	return false
}

// podObject is a background pod bound to its node and running: priority 0
// as with no PriorityClass, controlled by its DaemonSet or its
// Deployment's ReplicaSet, asking for the cpu and memory of its part of
// the background and, a GPU pod, for its GPUs.
func (b *background) podObject(p *bgPod, created metav1.Time) *v1.Pod {
	container := testobj.MakeContainer(p.app).Image("registry.k8s.io/pause:3.10")
	switch {
	case p.gpus > 0:
		cpu := *resource.NewMilliQuantity(b.gpuCPU.MilliValue()*p.gpus, resource.DecimalSI)
		memory := *resource.NewQuantity(b.gpuMemory.Value()*p.gpus, resource.BinarySI)
		container.Request(v1.ResourceCPU, cpu).Request(v1.ResourceMemory, memory).GPUs(p.gpus)
	case p.noisy:
		container.Request(v1.ResourceCPU, b.noisyCPU).Request(v1.ResourceMemory, b.noisyMemory)
	default:
		container.Request(v1.ResourceCPU, b.cpu).Request(v1.ResourceMemory, b.memory)
	}
	ownerKind, owner := "DaemonSet", p.app
	if p.kind == scenario.KindService {
		ownerKind, owner = "ReplicaSet", p.app+"-rs"
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.name, Namespace: backgroundNamespace, UID: types.UID("pod-" + p.name),
			CreationTimestamp: created,
			Labels:            map[string]string{"app": p.app, backgroundLabel: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: ownerKind, Name: owner,
				UID: types.UID(ownerKind + "-" + owner), Controller: ptr.To(true)}},
		},
		Spec: v1.PodSpec{
			NodeName:      p.node,
			SchedulerName: v1.DefaultSchedulerName,
			Priority:      ptr.To[int32](0),
			Containers:    []v1.Container{container.Obj()},
		},
		Status: v1.PodStatus{
			Phase:     v1.PodRunning,
			StartTime: &created,
			Conditions: []v1.PodCondition{
				{Type: v1.PodScheduled, Status: v1.ConditionTrue},
				{Type: v1.PodReady, Status: v1.ConditionTrue},
			},
		},
	}
}

// pdbObject is a budget with the status the disruption controller would
// write for it with healthy of its pods running: the Deployment wants
// spec.Pods, so desiredHealthy is that less maxUnavailable.
func pdbObject(p *bgPDB) *policyv1.PodDisruptionBudget {
	desired := max(p.spec.Pods-p.spec.MaxUnavailable, 0)
	allowed := max(p.healthy-desired, 0)
	cond := metav1.Condition{Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionTrue, Reason: policyv1.SufficientPodsReason,
		LastTransitionTime: metav1.NewTime(epoch), ObservedGeneration: 1}
	if allowed == 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, policyv1.InsufficientPodsReason
	}
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: p.spec.Name, Namespace: backgroundNamespace, UID: types.UID("pdb-" + p.spec.Name),
			Generation: 1, CreationTimestamp: metav1.NewTime(epoch)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(int32(p.spec.MaxUnavailable))),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": p.spec.App}},
		},
		Status: policyv1.PodDisruptionBudgetStatus{
			ObservedGeneration: 1,
			DisruptionsAllowed: int32(allowed),
			CurrentHealthy:     int32(p.healthy),
			DesiredHealthy:     int32(desired),
			ExpectedPods:       int32(p.spec.Pods),
			Conditions:         []metav1.Condition{cond},
		},
	}
}

// addBackground puts the plan's background pods and budgets into the
// tracker before the informers start, as it does the nodes: the scheduler
// lists them with its first sync.
func (c *cluster) addBackground() error {
	names := slices.Sorted(maps.Keys(c.bg.pods))
	for _, name := range names {
		pod := c.bg.podObject(c.bg.pods[name], metav1.NewTime(epoch))
		if err := c.cs.Tracker().Add(versioned(c.resourceVersion, pod)); err != nil {
			return err
		}
	}
	for _, p := range c.plan.PDBs {
		if err := c.cs.Tracker().Add(versioned(c.resourceVersion, pdbObject(c.bg.pdbs[p.Name]))); err != nil {
			return err
		}
	}
	// The initial list delivers them as adds: wait for those too.
	c.counts.wanted[kindPodAdd].Add(int64(len(names)))
	c.counts.wanted[kindPDBAdd].Add(int64(len(c.plan.PDBs)))
	return nil
}

// syncPDBs writes the status of the budgets in touched, in name order.
func (c *cluster) syncPDBs(ctx context.Context, touched map[string]bool) error {
	names := slices.Sorted(maps.Keys(touched))
	for _, name := range names {
		c.counts.want(kindPDBUpdate)
		pdb := versioned(c.resourceVersion, pdbObject(c.bg.pdbs[name]))
		if _, err := c.cs.PolicyV1().PodDisruptionBudgets(backgroundNamespace).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("budget %s: %w", name, err)
		}
	}
	return nil
}

// deleteBackgroundOn deletes the background pods of a node about to be
// deleted, as the pod garbage collector would, and returns them.
func (c *cluster) deleteBackgroundOn(ctx context.Context, node string) ([]*bgPod, error) {
	pods := c.bg.podsOn(node)
	touched := map[string]bool{}
	for _, p := range pods {
		c.counts.want(kindPodDelete)
		c.deletions.mine(p.name)
		if err := c.cs.CoreV1().Pods(backgroundNamespace).Delete(ctx, p.name, metav1.DeleteOptions{}); err != nil {
			return nil, fmt.Errorf("deleting background pod %s: %w", p.name, err)
		}
		c.bg.remove(p.name)
		c.changes.deletedBound = append(c.changes.deletedBound, &v1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: p.name, Namespace: backgroundNamespace, UID: types.UID("pod-" + p.name)}})
		if p.pdb != "" {
			touched[p.pdb] = true
		}
	}
	delete(c.bg.onNode, node)
	return pods, c.syncPDBs(ctx, touched)
}

// recreateBackground puts pods (those of a deleted node) on its
// replacement node, bound and running.
func (c *cluster) recreateBackground(ctx context.Context, pods []*bgPod, node string) error {
	touched := map[string]bool{}
	for _, old := range pods {
		p := &bgPod{name: scenario.BackgroundPodName(old.app, node), node: node, app: old.app, kind: old.kind, pdb: old.pdb,
			gpus: old.gpus, noisy: old.noisy}
		pod := c.bg.podObject(p, metav1.NewTime(epoch.Add(c.eng.now)))
		c.counts.want(kindPodAdd)
		if _, err := c.cs.CoreV1().Pods(backgroundNamespace).Create(ctx, versioned(c.resourceVersion, pod), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating background pod %s: %w", p.name, err)
		}
		c.bg.add(p)
		c.changes.createdBound = append(c.changes.createdBound, pod)
		if p.pdb != "" {
			touched[p.pdb] = true
		}
	}
	return c.syncPDBs(ctx, touched)
}

// evictedBackground takes background pods the scheduler deleted out of the
// record, updates their budgets' status and records them: those that held
// no GPU apart from those that did (gpuPods), whose GPUs count as evicted.
func (c *cluster) evictedBackground(ctx context.Context, names []string) error {
	touched := map[string]bool{}
	cpuOnly, gpuPods := 0, 0
	var gpus int64
	for _, name := range names {
		p := c.bg.remove(name)
		if p == nil {
			continue
		}
		if p.gpus > 0 {
			gpuPods++
			gpus += p.gpus
		} else {
			cpuOnly++
		}
		if p.pdb != "" {
			touched[p.pdb] = true
		}
	}
	if cpuOnly > 0 {
		c.rec.BackgroundEvicted(cpuOnly)
	}
	if gpuPods > 0 {
		c.rec.BackgroundGPUPodsEvicted(gpuPods, gpus)
	}
	return c.syncPDBs(ctx, touched)
}
