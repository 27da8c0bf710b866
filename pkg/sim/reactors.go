package sim

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

// The fake clientset's reactors stand in for what the API server does and
// the fake's tracker does not: bind pods and tell the scheduler's deletions
// (preemptions) from the simulator's own. They run under the fake's lock,
// so they use only the tracker, and what they record (bindLog, deletions,
// counters) has locks of its own.

// bindReactor returns the reactor that stands in for the API server's
// pods/binding subresource, which the fake tracker does not persist: it
// sets spec.nodeName and the PodScheduled condition on the stored pod and
// records the binding. It refuses pods or nodes that are gone and pods
// already bound, as the API server would. fault, when set, may fail a
// binding first (Options.BindFault).
func (c *cluster) bindReactor(fault func(pod *v1.Pod, node string) error) k8stesting.ReactionFunc {
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := action.(k8stesting.CreateAction)
		if !ok || action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		binding, ok := create.GetObject().(*v1.Binding)
		if !ok {
			return true, nil, fmt.Errorf("binding: unexpected %T", create.GetObject())
		}
		tracker := c.cs.Tracker()
		podsResource := v1.SchemeGroupVersion.WithResource("pods")
		nodesResource := v1.SchemeGroupVersion.WithResource("nodes")
		if _, err := tracker.Get(nodesResource, "", binding.Target.Name); err != nil {
			return true, nil, err
		}
		obj, err := tracker.Get(podsResource, action.GetNamespace(), binding.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*v1.Pod).DeepCopy()
		if fault != nil {
			if err := fault(pod, binding.Target.Name); err != nil {
				return true, nil, err
			}
		}
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(podsResource.GroupResource(), pod.Name, fmt.Errorf("pod is already bound to %s", pod.Spec.NodeName))
		}
		pod.Spec.NodeName = binding.Target.Name
		pod.ResourceVersion = strconv.FormatInt(c.resourceVersion.Add(1), 10)
		pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionTrue})
		if err := tracker.Update(podsResource, pod, action.GetNamespace()); err != nil {
			return true, nil, err
		}
		c.counts.want(kindPodBind)
		now := time.Now()
		if c.dra != nil {
			c.dra.bound(pod.Name, now)
		}
		c.binds.add(bindRecord{pod: pod.Name, uid: pod.UID, node: pod.Spec.NodeName, at: now})
		return true, binding, nil
	}
}

// deleteReactor sees every pod deletion before the tracker applies it. A
// deletion the simulator did not announce is a preemption: it is recorded,
// and the informers' delete is awaited like the simulator's own. A pod
// that owns ResourceClaims will have them released (dra.go).
func (c *cluster) deleteReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	del, ok := action.(k8stesting.DeleteAction)
	if !ok {
		return false, nil, nil
	}
	obj, err := c.cs.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), del.GetNamespace(), del.GetName())
	if err != nil {
		return false, nil, nil // the tracker answers NotFound; no delete event follows
	}
	if pod, ok := obj.(*v1.Pod); ok && c.dra != nil {
		c.dra.podDeleting(c.counts, pod)
	}
	if c.deletions.record(del.GetName()) {
		c.counts.want(kindPodDelete)
	}
	return false, nil, nil
}

// bindLog records the bindings the reactor performed, in order, until each
// of its readers has read them: a month-long run binds a million pods, and
// a record nobody will read again is dropped.
type bindLog struct {
	mu      sync.Mutex
	records []bindRecord
	readers []*bindReader
}

type bindRecord struct {
	pod, node string
	uid       types.UID
	at        time.Time
}

// bindReader is one reader's place in a bindLog.
type bindReader struct {
	log *bindLog
	// next indexes the first record in log.records this reader has not read.
	next int
}

func (l *bindLog) add(r bindRecord) {
	l.mu.Lock()
	l.records = append(l.records, r)
	l.mu.Unlock()
}

// reader returns a new reader, placed before every record still kept.
// Register every reader before the first binding.
func (l *bindLog) reader() *bindReader {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &bindReader{log: l}
	l.readers = append(l.readers, r)
	return r
}

// unread returns the records this reader has not read yet.
func (r *bindReader) unread() []bindRecord {
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bindRecord(nil), l.records[r.next:]...)
}

// read marks the first n unread records read. Once every reader has read
// at least half of the records kept, those all have read are dropped.
func (r *bindReader) read(n int) {
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	r.next += n
	done := r.next
	for _, other := range l.readers {
		done = min(done, other.next)
	}
	if done == 0 || 2*done < len(l.records) {
		return
	}
	l.records = append([]bindRecord(nil), l.records[done:]...)
	for _, other := range l.readers {
		other.next -= done
	}
}

// kept is how many records the log holds.
func (l *bindLog) kept() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.records)
}

// deletions tells the scheduler's pod deletions from the simulator's: the
// simulator announces every pod it deletes itself (mine), and any other
// deletion is a preemption's.
type deletions struct {
	mu      sync.Mutex
	own     map[string]bool
	evicted []string
}

// mine announces that the simulator is about to delete pod name.
func (d *deletions) mine(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.own == nil {
		d.own = map[string]bool{}
	}
	d.own[name] = true
}

// record notes a deletion of name and reports whether the scheduler made it.
func (d *deletions) record(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.own[name] {
		delete(d.own, name)
		return false
	}
	d.evicted = append(d.evicted, name)
	return true
}

func (d *deletions) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.evicted
	d.evicted = nil
	return out
}

// refuseJobPatches returns the reactor that refuses, for good, every patch
// of the Jobs it picks: a seeded share of them, chosen by name, as an
// admission webhook that denies updates of some Jobs would (scenario
// soak.refuseJobPatches). refused counts the patches it refused.
func refuseJobPatches(share float64, seed uint64, refused *atomic.Int64) k8stesting.ReactionFunc {
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		patch, ok := action.(k8stesting.PatchAction)
		if !ok {
			return false, nil, nil
		}
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s/%s", seed, patch.GetNamespace(), patch.GetName())
		if float64(h.Sum64()%1_000_000) >= share*1_000_000 {
			return false, nil, nil
		}
		refused.Add(1)
		return true, nil, apierrors.NewForbidden(batchv1.Resource("jobs"), patch.GetName(),
			fmt.Errorf("admission webhook %q denied the request: updates of this Job are not allowed", "deny.sim.muster.dev"))
	}
}
