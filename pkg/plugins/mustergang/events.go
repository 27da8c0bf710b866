package mustergang

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// notice explains the gang's state once per change: a log line, the PodGroup
// status and, for outcomes that are Events (Outcome.IsEvent), an Event on the
// gang's owner.
func (p *Plugin) notice(ctx context.Context, info *gangInfo, outcome gang.Outcome, message string) bool {
	return p.noticeAt(ctx, info, outcome, message, p.now())
}

// noticeAt is notice at a time the caller knows (a timer's callback must not
// read a fake clock that is running it).
func (p *Plugin) noticeAt(ctx context.Context, info *gangInfo, outcome gang.Outcome, message string, now time.Time) bool {
	if !p.registry.Notice(info.key, outcome, message, now) {
		return false
	}
	klog.FromContext(ctx).V(2).Info("Gang notice", "gang", info.key, "reason", outcome.Reason(), "message", message)
	if info.owner != nil && outcome.IsEvent() {
		p.handle.EventRecorder().Eventf(info.owner, nil, outcome.EventType(), outcome.Reason(), "Scheduling", "%s", message)
	}
	p.status.enqueue(info.key)
	return true
}

// noticeKey is notice for callers that only have the gang's key.
func (p *Plugin) noticeKey(ctx context.Context, key gang.Key, outcome gang.Outcome, message string) {
	info := &gangInfo{key: key}
	if ref := p.ownerRef(key); ref != nil {
		info.owner = ref // never a typed nil: the recorder would dereference it
	}
	p.notice(ctx, info, outcome, message)
}

func (p *Plugin) ownerRef(key gang.Key) *v1.ObjectReference {
	switch key.Kind {
	case gang.KindJob:
		if job, err := p.jobs.Jobs(key.Namespace).Get(key.Name); err == nil {
			return jobRef(job)
		}
	case gang.KindStatefulSet:
		if sts, err := p.sets.StatefulSets(key.Namespace).Get(key.Name); err == nil {
			return statefulSetRef(sts)
		}
	case gang.KindWorkloadPodGroup:
		if pg, err := p.workloadGroup(key); err == nil {
			return workloadGroupRef(pg)
		}
	case gang.KindPodGroup:
		if p.podGroups == nil {
			return nil
		}
		if obj, err := p.podGroups.ByNamespace(key.Namespace).Get(key.Name); err == nil {
			if pg, err := v1alpha1.FromUnstructured(obj); err == nil {
				return podGroupRef(pg)
			}
		}
	}
	return nil
}

// podEvent records the outcome on the pod itself, for what users must see
// on the pod as well as on the gang's owner.
func (p *Plugin) podEvent(pod *v1.Pod, outcome gang.Outcome, message string) {
	p.handle.EventRecorder().Eventf(pod, nil, outcome.EventType(), outcome.Reason(), "Scheduling", "%s", message)
}
