package sim

import (
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// namespace holds every simulated workload. The cluster's labels, taints
// and resources are muster's node vocabulary (pkg/apis/config/v1).
const namespace = "sim"

// epoch is virtual time zero; object timestamps are epoch plus virtual time,
// so they are the same in every run of a seed.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Per worker, CPU and memory grow with the GPUs (6 cores and 48Gi per GPU) so
// they never bind before the GPUs do on a 64-core, 512Gi, 8-GPU node.
const (
	cpuPerGPU   = 6
	memGiPerGPU = 48
	workerName  = "tensorflow"
)

func nodeObject(n nodeSpec, cpu, memory resource.Quantity) *v1.Node {
	node := testobj.MakeNode(n.name).UID("node-" + n.name).CPU(cpu).Memory(memory).GPUs(n.gpus).
		Rack(n.rack).Zone(n.zone).Ready()
	if n.spot {
		node.Spot()
	}
	if n.dra {
		node.NoGPUResource() // its GPUs are the devices of its ResourceSlice
	}
	return node.Obj()
}

// reclaimTaint is what GKE puts on a spot node about to be reclaimed.
func reclaimTaint() v1.Taint {
	return v1.Taint{Key: configv1.TaintGKEImpendingTermination, Value: "true", Effect: v1.TaintEffectNoSchedule}
}

func jobObject(j *scenario.Job, schedulerName string, submit time.Duration) *batchv1.Job {
	return testobj.MakeJob(namespace, j.Name).UID("job-" + j.Name).Created(epoch.Add(submit)).
		Indexed().Workers(int32(j.Members())).SchedulerName(schedulerName).RestartPolicy(v1.RestartPolicyNever).Obj()
}

// podGroupName names the native PodGroup of one attempt of a job.
func podGroupName(j *scenario.Job, attempt int) string {
	if attempt == 0 {
		return j.Name
	}
	return fmt.Sprintf("%s-r%d", j.Name, attempt)
}

// podGroupObject is the native PodGroup of one attempt of a job; topologyKey
// (TAS only, "" for none) is the node label whose domain the gang must fit in.
func podGroupObject(j *scenario.Job, attempt int, created time.Duration, topologyKey string) *schedulingv1beta1.PodGroup {
	name := podGroupName(j, attempt)
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, UID: types.UID("podgroup-" + name),
			CreationTimestamp: metav1.NewTime(epoch.Add(created)),
		},
		Spec: schedulingv1beta1.PodGroupSpec{
			Priority: ptr.To(j.Priority),
			// A MultiWorkerMirroredStrategy job cannot go on without any of
			// its workers: preemption takes the group whole or not at all.
			DisruptionMode: &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}},
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(j.Members())},
			},
		},
	}
	if topologyKey != "" {
		pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
			Topology: []schedulingv1beta1.TopologyConstraint{{Key: topologyKey}},
		}
	}
	return pg
}

// domainGPUs are the GPUs of the largest rack and the largest zone of the
// plan's nodes at the start.
type domainGPUs struct{ rack, zone int64 }

func domainsOf(nodes []scenario.Node) domainGPUs {
	racks, zones := map[string]int64{}, map[string]int64{}
	for _, n := range nodes {
		racks[n.Rack] += n.GPUs
		zones[n.Zone] += n.GPUs
	}
	var d domainGPUs
	for _, g := range racks {
		d.rack = max(d.rack, g)
	}
	for _, g := range zones {
		d.zone = max(d.zone, g)
	}
	return d
}

// topologyKeyFor is the smallest domain a gang of j fits in on an empty
// cluster, as a user of topology-aware scheduling would ask for: a rack,
// else a zone, else none (""). Its CPU-only members need no GPU.
func topologyKeyFor(j *scenario.Job, d domainGPUs) string {
	gpus := int64(j.Workers) * j.GPUs
	switch {
	case gpus <= d.rack:
		return configv1.LabelRack
	case gpus <= d.zone:
		return configv1.LabelZone
	}
	return ""
}

// podName is the name of worker index of attempt: j-<index> first, then
// j-r<attempt>-<index>, so a sorted listing keeps attempts together.
func podName(j *scenario.Job, attempt, index int) string {
	if attempt == 0 {
		return fmt.Sprintf("%s-%d", j.Name, index)
	}
	return fmt.Sprintf("%s-r%d-%d", j.Name, attempt, index)
}

// podObject is one member as the Job controller would create it: controlled
// by the Job (muster's zero-config gang), indexed, a worker asking for GPUs
// (with the workload's pod anti-affinity, anti, when set) or, at an index
// past the workers, a CPU-only member (a TFJob's parameter server) asking
// for cpuMember; for native gang scheduling it also names its PodGroup.
func podObject(j *scenario.Job, job *batchv1.Job, b *built, attempt, index int, created time.Duration, cpuMember v1.ResourceList,
	anti *scenario.AntiAffinity) *v1.Pod {
	name := podName(j, attempt, index)
	worker := testobj.MakeContainer(workerName).Image(testobj.WorkerImage)
	if index < j.Workers {
		worker.Request(v1.ResourceCPU, *resource.NewQuantity(cpuPerGPU*j.GPUs, resource.DecimalSI)).
			Request(v1.ResourceMemory, resource.MustParse(fmt.Sprintf("%dGi", memGiPerGPU*j.GPUs))).
			GPUs(j.GPUs)
	} else {
		worker.Request(v1.ResourceCPU, cpuMember[v1.ResourceCPU]).Request(v1.ResourceMemory, cpuMember[v1.ResourceMemory])
	}
	pod := testobj.MakePod(namespace, name).UID("pod-"+name).Created(epoch.Add(created)).JobMember(job, index).
		SchedulerName(b.schedulerName).Priority(j.Priority).RestartPolicy(v1.RestartPolicyNever).
		SchedulingGate(stepGate).Container(worker.Obj()).Phase(v1.PodPending)
	if j.Policy != "" {
		pod.Annotation(gang.AnnotationPreemptible, j.Policy)
	}
	if b.podGroups {
		pod.PodGroup(podGroupName(j, attempt))
	}
	affinity := &v1.Affinity{}
	if b.schedulerName == v1.DefaultSchedulerName {
		affinity = spotAffinity(j.Policy)
	}
	if anti != nil && index < j.Workers {
		affinity.PodAntiAffinity = workerAntiAffinity(j.Name, anti)
	}
	if affinity.NodeAffinity != nil || affinity.PodAntiAffinity != nil {
		pod.Affinity(affinity)
	}
	return pod.Obj()
}

// workerAntiAffinity is the required pod anti-affinity on the node that
// workload.antiAffinity asks for: none of another job's pods (their
// job-name label is set and is not job), none of the noisy pods.
func workerAntiAffinity(job string, anti *scenario.AntiAffinity) *v1.PodAntiAffinity {
	var terms []v1.PodAffinityTerm
	if anti.OtherGangs {
		terms = append(terms, v1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: batchv1.JobNameLabel, Operator: metav1.LabelSelectorOpExists},
				{Key: batchv1.JobNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{job}},
			}},
			TopologyKey: configv1.LabelHostname,
		})
	}
	if anti.NoisyPods {
		terms = append(terms, v1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": scenario.NoisyApp}},
			Namespaces:    []string{backgroundNamespace},
			TopologyKey:   configv1.LabelHostname,
		})
	}
	return &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: terms}
}

// spotAffinity says with node affinity what the muster.dev/preemptible
// policy says to muster, for schedulers that do not read the annotation:
// forbid and require are required terms on the spot label, avoid (the
// default) and prefer are preferred ones.
func spotAffinity(policy string) *v1.Affinity {
	spot := v1.NodeSelectorRequirement{Key: configv1.LabelGKESpot, Operator: v1.NodeSelectorOpIn, Values: []string{"true"}}
	onDemand := v1.NodeSelectorRequirement{Key: configv1.LabelGKESpot, Operator: v1.NodeSelectorOpDoesNotExist}
	required := func(r v1.NodeSelectorRequirement) *v1.Affinity {
		return &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{r}}}}}}
	}
	preferred := func(r v1.NodeSelectorRequirement) *v1.Affinity {
		return &v1.Affinity{NodeAffinity: &v1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{
			{Weight: 100, Preference: v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{r}}}}}}
	}
	switch policy {
	case "forbid":
		return required(onDemand)
	case "require":
		return required(spot)
	case "prefer":
		return preferred(spot)
	}
	return preferred(onDemand)
}
