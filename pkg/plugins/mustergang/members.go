package mustergang

import (
	"fmt"
	batchv1 "k8s.io/api/batch/v1"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

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
}

// resolve finds the pod's gang and its quorum. ok is false for a pod
// scheduled alone; err explains a gang that cannot be served yet or at all.
func (p *Plugin) resolve(pod *v1.Pod) (info *gangInfo, ok bool, err error) {
	key, ok := gang.KeyOf(pod)
	if !ok {
		return nil, false, nil
	}
	info = &gangInfo{key: key, timeout: time.Duration(p.args.DefaultScheduleTimeoutSeconds) * time.Second}
	switch key.Kind {
	case gang.KindJob:
		job, err := p.jobs.Jobs(key.Namespace).Get(key.Name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return info, true, fmt.Errorf("gang %s: Job %s not found", key, key.Name)
			}
			return info, true, err
		}
		info.owner = jobRef(job)
		if info.quorum, err = gang.JobQuorum(job, pod); err != nil {
			return info, true, fmt.Errorf("gang %s: %w", key, err)
		}
	case gang.KindPodGroup:
		if p.podGroups == nil {
			return info, true, fmt.Errorf("gang %s: pod has label %s but the PodGroup API (podgroups.scheduling.x-k8s.io) is not installed; apply manifests/crds and restart muster",
				key, v1alpha1.PodGroupLabel)
		}
		obj, err := p.podGroups.ByNamespace(key.Namespace).Get(key.Name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return info, true, fmt.Errorf("gang %s: PodGroup %s not found in namespace %s", key, key.Name, key.Namespace)
			}
			return info, true, err
		}
		pg, err := v1alpha1.FromUnstructured(obj)
		if err != nil {
			return info, true, err
		}
		info.owner = podGroupRef(pg)
		if pg.Spec.MinMember < 1 {
			return info, true, fmt.Errorf("gang %s: PodGroup spec.minMember must be at least 1, got %d", key, pg.Spec.MinMember)
		}
		info.quorum = int(pg.Spec.MinMember)
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

func podGroupRef(pg *v1alpha1.PodGroup) *v1.ObjectReference {
	return &v1.ObjectReference{
		APIVersion: v1alpha1.SchemeGroupVersion.String(),
		Kind:       "PodGroup",
		Namespace:  pg.Namespace,
		Name:       pg.Name,
		UID:        pg.UID,
	}
}

// members lists the gang's live pods: pending (unbound, not being deleted,
// not already allowed, not held by a scheduling gate) sorted by name, how
// many count as bound (bound in the API or allowed and binding), and the
// total of live members including gated ones.
func (p *Plugin) members(key gang.Key) (pending []*v1.Pod, bound int, total int) {
	objs, _ := p.pods.ByIndex(gangIndex, key.String())
	inFlight := p.registry.InFlight(key)
	for _, obj := range objs {
		pod := obj.(*v1.Pod)
		if pod.DeletionTimestamp != nil {
			continue
		}
		total++
		switch {
		case pod.Spec.NodeName != "" || inFlight.Has(pod.UID):
			bound++
		case len(pod.Spec.SchedulingGates) > 0:
			// Another controller holds it back; planning it would hold
			// capacity for a pod that cannot come.
		default:
			pending = append(pending, pod)
		}
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].Name < pending[j].Name })
	return pending, bound, total
}
