package mustergang

import (
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// gangInfo is what a pod's gang asks for, resolved from the PodGroup or Job.
type gangInfo struct {
	key     gang.Key
	quorum  int
	timeout time.Duration
	// owner is the object events about the gang are recorded on.
	owner runtime.Object
	// noGang explains why the owner's pods can never form a gang; each is
	// then placed as it comes (quorum 1).
	noGang string
	// required is a topology level the owner itself requires (a Kubernetes
	// PodGroup's schedulingConstraints), beside the members' annotations.
	required string
}

// ownerMissing explains a failed lookup of the gang's owner: a missing one by
// name, any other error as it is.
func ownerMissing(key gang.Key, kind string, err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("gang %s: %s %s not found in namespace %s", key, kind, key.Name, key.Namespace)
	}
	return err
}

// resolve finds the pod's gang and its quorum. ok is false for a pod
// scheduled alone; err explains a gang that cannot be served yet or at all.
func (p *Plugin) resolve(pod *v1.Pod) (info *gangInfo, ok bool, err error) {
	key, ok := gang.KeyOf(pod)
	if !ok {
		return nil, false, nil
	}
	info = &gangInfo{key: key, timeout: time.Duration(p.args.DefaultScheduleTimeoutSeconds) * time.Second}
	// owner is what defines the quorum: the gang itself, or for a
	// Kubernetes PodGroup of the basic policy the Job or StatefulSet that
	// made it (with WorkloadWithJob every Job gets one).
	owner := key
	if key.Kind == gang.KindWorkloadPodGroup {
		isGang, err := p.resolveWorkloadGroup(info, pod)
		if err != nil {
			return info, true, err
		}
		if !isGang {
			if owner, ok = gang.ControllerKey(pod); !ok {
				return info, false, nil
			}
		}
	}
	switch owner.Kind {
	case gang.KindJob:
		job, err := p.jobs.Jobs(owner.Namespace).Get(owner.Name)
		if err != nil {
			return info, true, ownerMissing(owner, "Job", err)
		}
		info.owner = jobRef(job)
		if info.quorum, err = gang.JobQuorum(job, pod); err != nil {
			return info, true, fmt.Errorf("gang %s: %w", key, err)
		}
	case gang.KindStatefulSet:
		sts, err := p.sets.StatefulSets(owner.Namespace).Get(owner.Name)
		if err != nil {
			return info, true, ownerMissing(owner, "StatefulSet", err)
		}
		info.owner = statefulSetRef(sts)
		var orderedReady bool
		if info.quorum, orderedReady, err = gang.StatefulSetQuorum(sts, pod); err != nil {
			return info, true, fmt.Errorf("gang %s: %w", key, err)
		}
		if orderedReady && ptr.Deref(sts.Spec.Replicas, 1) > 1 {
			info.noGang = fmt.Sprintf("StatefulSet %s has podManagementPolicy OrderedReady: its controller creates one pod at a time and waits for it to be Ready, "+
				"so its %d pods can never be placed as one gang; muster places each as it comes, next to its siblings when they fit. "+
				"Set podManagementPolicy: Parallel for a gang", sts.Name, *sts.Spec.Replicas)
		}
	case gang.KindPodGroup:
		if p.podGroups == nil {
			return info, true, fmt.Errorf("gang %s: pod has label %s but the PodGroup API (podgroups.scheduling.x-k8s.io) is not installed; apply manifests/crds and restart muster",
				key, v1alpha1.PodGroupLabel)
		}
		obj, err := p.podGroups.ByNamespace(key.Namespace).Get(key.Name)
		if err != nil {
			return info, true, ownerMissing(key, "PodGroup", err)
		}
		pg, err := v1alpha1.FromUnstructured(obj)
		if err != nil {
			return info, true, err
		}
		info.owner = podGroupRef(pg)
		if pg.Spec.MinMember < 1 {
			return info, true, fmt.Errorf("gang %s: PodGroup spec.minMember must be at least 1, got %d", key, pg.Spec.MinMember)
		}
		// Members that finished successfully leave the informer but still
		// count: the rest are not held waiting for them.
		done := max(int(pg.Status.Succeeded), p.registry.Succeeded(key))
		info.quorum = max(int(pg.Spec.MinMember)-done, 1)
		if t := pg.Spec.ScheduleTimeoutSeconds; t != nil && *t > 0 {
			info.timeout = time.Duration(*t) * time.Second
		}
	}
	// The framework cuts a Permit wait at 15 minutes.
	info.timeout = min(info.timeout, 15*time.Minute)
	return info, true, nil
}

func jobRef(job *batchv1.Job) *v1.ObjectReference {
	return &v1.ObjectReference{APIVersion: "batch/v1", Kind: "Job", Namespace: job.Namespace, Name: job.Name, UID: job.UID}
}

func statefulSetRef(sts *appsv1.StatefulSet) *v1.ObjectReference {
	return &v1.ObjectReference{APIVersion: "apps/v1", Kind: "StatefulSet", Namespace: sts.Namespace, Name: sts.Name, UID: sts.UID}
}

func podGroupRef(pg *v1alpha1.PodGroup) *v1.ObjectReference {
	return &v1.ObjectReference{
		APIVersion: v1alpha1.SchemeGroupVersion.String(),
		Kind:       "PodGroup",
		Namespace:  pg.Namespace,
		Name:       pg.Name,
		UID:        pg.UID,
	}
}

// memberSet is a gang's live pods as the scheduler sees them.
type memberSet struct {
	// pending members (unbound, not being deleted, not already allowed, not
	// held by a scheduling gate), sorted by name.
	pending []*v1.Pod
	// boundNodes has one entry per member bound in the API or allowed and
	// binding: the node it is on.
	boundNodes []string
	// total counts every live member, gated ones included.
	total int
}

func (m memberSet) bound() int { return len(m.boundNodes) }

// members lists the gang's live pods of this plugin's profile.
func (p *Plugin) members(key gang.Key) memberSet {
	return p.membersIn(p.gangIndex, key)
}

// pendingInAnyProfile lists the gang's pending members of every profile:
// a plan dropped in one profile frees capacity for the gangs of all of
// them. The profiles share the pod informer, each with its own gang index,
// and the scheduling queue.
func (p *Plugin) pendingInAnyProfile(key gang.Key) []*v1.Pod {
	var pending []*v1.Pod
	for _, index := range p.gangIndexes() {
		pending = append(pending, p.membersIn(index, key).pending...)
	}
	return pending
}

// gangHasPods reports whether any profile's gang index still holds a pod
// of the gang: the registry's state of a gang is shared by the profiles.
func (p *Plugin) gangHasPods(key gang.Key) bool {
	for _, index := range p.gangIndexes() {
		if objs, _ := p.pods.ByIndex(index, key.String()); len(objs) > 0 {
			return true
		}
	}
	return false
}

// gangIndexes are the pod informer's gang indexes, one per muster profile.
func (p *Plugin) gangIndexes() []string {
	var out []string
	for name := range p.pods.GetIndexers() {
		if strings.HasPrefix(name, gangIndexPrefix) {
			out = append(out, name)
		}
	}
	return out
}

// membersIn lists the gang's live pods in the pod informer's gang index.
func (p *Plugin) membersIn(index string, key gang.Key) memberSet {
	var set memberSet
	var objs []interface{}
	if key.Kind == gang.KindPod {
		// A pod scheduled alone that preempted is a gang of itself.
		if obj, ok, _ := p.pods.GetByKey(key.Namespace + "/" + key.Name); ok {
			objs = append(objs, obj)
		}
	} else {
		objs, _ = p.pods.ByIndex(index, key.String())
	}
	inFlight := p.registry.InFlight(key)
	for _, obj := range objs {
		pod := obj.(*v1.Pod)
		if pod.DeletionTimestamp != nil {
			continue
		}
		set.total++
		if node, ok := inFlight[pod.UID]; pod.Spec.NodeName != "" || ok {
			if pod.Spec.NodeName != "" {
				node = pod.Spec.NodeName
			}
			set.boundNodes = append(set.boundNodes, node)
			continue
		}
		if len(pod.Spec.SchedulingGates) > 0 {
			// Another controller holds it back; planning it would hold
			// capacity for a pod that cannot come.
			continue
		}
		set.pending = append(set.pending, pod)
	}
	sort.Slice(set.pending, func(i, j int) bool { return set.pending[i].Name < set.pending[j].Name })
	sort.Strings(set.boundNodes)
	return set
}
