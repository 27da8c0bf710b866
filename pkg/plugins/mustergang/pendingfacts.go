package mustergang

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// pendingFacts keeps what planning reads of a pending member that depends on
// the pod object alone: its PodInfo (affinity terms parsed, requests summed
// once: CalculateResource caches them) and its templateKey. A queued gang is
// gathered again at every capacity change, by each member's cycle and its
// PostFilter: without this a gang of n members computed n² requests per
// wake. An entry is valid while the informer holds the same object (an
// update replaces the pointer) and is dropped when the pod is bound or
// deleted (forget), so it never outlives its pod.
type pendingFacts struct {
	mu    sync.Mutex
	byUID map[types.UID]*memberFacts
}

type memberFacts struct {
	pod      *v1.Pod
	info     *framework.PodInfo
	template string
}

// of returns pod's facts, computed now unless kept for this very object.
func (f *pendingFacts) of(pod *v1.Pod) (*memberFacts, error) {
	f.mu.Lock()
	kept := f.byUID[pod.UID]
	f.mu.Unlock()
	if kept != nil && kept.pod == pod {
		return kept, nil
	}
	info, err := framework.NewPodInfo(pod)
	if err != nil {
		return nil, err
	}
	info.CalculateResource()
	facts := &memberFacts{pod: pod, info: info, template: templateKey(pod)}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byUID == nil {
		f.byUID = map[types.UID]*memberFacts{}
	}
	f.byUID[pod.UID] = facts
	return facts, nil
}

// forget drops pod's facts: it was bound or deleted.
func (f *pendingFacts) forget(uid types.UID) {
	f.mu.Lock()
	delete(f.byUID, uid)
	f.mu.Unlock()
}

func (f *pendingFacts) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byUID)
}
