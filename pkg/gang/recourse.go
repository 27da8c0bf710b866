package gang

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// A member that found no node: the gang's side of the scheduler's
// PostFilter. Unplaced keeps the order of the steps; what only the
// scheduler knows it asks of a RecourseCycle.

// RecourseCycle is the scheduler's side of a member's cycle that found no
// node.
type RecourseCycle interface {
	Cycle
	// HeldOut reports whether a pod scheduled alone was kept off capacity
	// that gang plans hold (known false: the pod is no such pod, or was
	// refused before that was asked).
	HeldOut(pod *v1.Pod) (heldOut, known bool)
	// TerminatingFor counts the pods of lower priority than pod that
	// terminate by preemption on node, none where the profile's filters
	// refuse pod for good.
	TerminatingFor(pod *v1.Pod, node string) int
	// ReleaseEarlierAllocation releases a device allocation an earlier
	// attempt of pod left behind and says what it did ("" for nothing).
	ReleaseEarlierAllocation(pod *v1.Pod) string
	// WaitsForVictims says whether the member was turned away only because
	// its plan still waits for the pods it preempted, and why.
	WaitsForVictims(key Key, plan *ActivePlan, slot string) (string, bool)
	// InSnapshot reports whether node is in the cycle's snapshot.
	InSnapshot(node string) bool
	// RefusedAt says why the member could not go to its slot, and whether
	// a filter refused it there after muster's PreFilter steered it (the
	// pair is then avoided).
	RefusedAt(pod *v1.Pod, slot string) (why string, avoid bool)
	// Preemption says whether gangs may preempt, and how often a gang may
	// try.
	Preemption() (enabled bool, interval time.Duration)
	// StillTerminating counts the pods the gang's last preemption evicted
	// that still terminate where the gang could use their room.
	StillTerminating(key Key) (int, error)
	// SearchVictims finds what to evict so that the gathered gang fits
	// (nil when nothing would make room), changing nothing.
	// SearchVictims returns ErrEarlierEvictionsUnfinished, without
	// searching, while evictions an earlier run of the scheduler began are
	// still being finished.
	SearchVictims() (*Victims, error)
}

// Victims is what a preemption evicts: the pods, the units they form
// (gangs or lone pods, each evicted whole), and the plan they make room for.
type Victims struct {
	Plan  *Plan
	Pods  []*v1.Pod
	Units []VictimUnit
	// Violations: chosen pods beyond their PodDisruptionBudgets.
	Violations int
}

// Recourse is what follows a member's cycle that found no node.
type Recourse struct {
	Key Key
	// Nominate is the node the member is nominated to ("" clears its
	// nomination).
	Nominate string
	// Message is why the member waits; Err, set instead, is a failed cycle.
	Message string
	Err     error
	// Owner is where Followup's notices go (nil: looked up).
	Followup
	Owner *v1.ObjectReference
	// WaitsForCache is the plan whose members wait for the scheduler's
	// cache to drop their victims.
	WaitsForCache *ActivePlan
	// Evict is the plan (its ID) whose victims are to be evicted now;
	// Preempted counts their GPUs.
	Evict     int64
	Preempted int64
}

// ErrEarlierEvictionsUnfinished is SearchVictims' answer while the
// evictions an earlier run of the scheduler began (it stopped, or lost its
// lease, halfway) are still being finished: the capacity they free is not
// searched for a second time.
var ErrEarlierEvictionsUnfinished = errors.New("the preemptions begun before this scheduler started are still being finished")

// AvoidFor is how long a (member, node) pair the framework rejected in a
// real cycle is kept out of new plans.
const AvoidFor = time.Minute

// Unplaced decides what follows pod's cycle that found no node. A member
// with a plan keeps its slot while the plan waits for its victims;
// otherwise the plan is dropped, and the pair avoided when a filter refused
// the member at its slot. A member without a plan may preempt.
func (d Decisions) Unplaced(c RecourseCycle, pod *v1.Pod) (r Recourse) {
	key, plan := d.gangs.PlanOf(pod.UID)
	if plan == nil {
		if heldOut, known := c.HeldOut(pod); known {
			d.gangs.HeldOut(LoneKey(pod), heldOut, c.Now())
		}
		if msg := c.ReleaseEarlierAllocation(pod); msg != "" {
			return Recourse{Nominate: KeptNomination(c, pod), Message: msg}
		}
		if r = d.Preempt(c, pod); r.Evict == 0 {
			r.Nominate = KeptNomination(c, pod)
		}
		r.forgetIfEnded(d.gangs, c, LoneKey(pod)) // it may be deleted and held out
		return r
	}
	r.Key = key
	slot := plan.Slots[pod.UID]
	if msg, waiting := c.WaitsForVictims(key, plan, slot); waiting {
		// The hold stays; the end of the wait requeues the member.
		return Recourse{Key: key, Nominate: slot, Message: msg, WaitsForCache: plan}
	}
	now := c.Now()
	if !c.InSnapshot(slot) {
		// The planned node left the cycle's snapshot before muster's node
		// handler dropped the plan: the same node change, no backoff.
		r.Effects = append(r.Effects, d.gangs.NodeChanged(key, plan.ID, slot, "was deleted", now, now.Add(AvoidFor)))
		r.Message = fmt.Sprintf("%s: planned node %s was deleted", key.Subject(), slot)
		return r
	}
	why, avoid := c.RefusedAt(pod, slot)
	reason := fmt.Sprintf("member %s cannot go to its planned node %s: %s", pod.Name, slot, why)
	r.Effects = append(r.Effects, d.gangs.PlanBroken(key, plan.ID, pod.UID, slot, reason, avoid, now, now.Add(AvoidFor), c.BackoffBase()))
	r.Message = fmt.Sprintf("%s: %s", key.Subject(), reason)
	return r
}

// KeptNomination is pod's nomination while pods of lower priority still
// terminate by preemption there ("" otherwise), as DefaultPreemption keeps
// it: it keeps their room for pod, and after a restart, when the manager
// has forgotten the preemption, it says where they are.
func KeptNomination(c RecourseCycle, pod *v1.Pod) string {
	if node := pod.Status.NominatedNodeName; node != "" && c.TerminatingFor(pod, node) > 0 {
		return node
	}
	return ""
}

// Preempt makes room for the gang of pod (or for pod alone, a gang of
// itself) that cannot be planned, by evicting whole units of lower
// priority (RecourseCycle.SearchVictims). The plan is installed at once,
// its slots held and pod nominated to its own; the members wait until
// the victims have terminated. r.Evict is set when victims are to go.
func (d Decisions) Preempt(c RecourseCycle, pod *v1.Pod) (r Recourse) {
	enabled, interval := c.Preemption()
	if !enabled {
		r.Message = "gang preemption is off"
		return r
	}
	info, inGang, err := c.Resolve(pod)
	if err != nil {
		r.Message = err.Error()
		return r
	}
	if !inGang {
		// A gang of itself, its own Event target.
		info = &Resolved{Key: LoneKey(pod), Ref: Reference(pod), Constraints: info.Constraints,
			Ask: Ask{Quorum: 1, Timeout: info.Timeout}}
	} else if d.gangs.Phase(info.Key) != PhaseUnschedulable {
		// Waiting for members, backing off, invalid: eviction cannot help.
		r.Message = "gang is not waiting for capacity"
		return r
	}
	key := info.Key
	r.Key, r.Owner = key, info.Ref
	defer r.forgetIfEnded(d.gangs, c, key)
	now := c.Now()
	planning, why, err := d.mayPreempt(c, key, pod, now, interval)
	if planning == nil {
		r.Message, r.Err = why, err
		return r
	}
	g, refusal := c.Gather(pod, info, planning)
	if refusal != nil {
		r.Effects = append(r.Effects, d.gangs.Refused(key, *refusal, c.Now()))
		r.Message = refusal.Message
		return r
	}
	if g.Never != "" {
		r.Message = fmt.Sprintf("not eligible for preemption: %s has preemptionPolicy Never", g.Never)
		return r
	}
	if !d.gangs.TryPreemption(key, now, interval) {
		r.Message = fmt.Sprintf("%s tried preemption recently", key.Subject())
		return r
	}
	found, err := c.SearchVictims()
	if errors.Is(err, ErrEarlierEvictionsUnfinished) {
		// Their capacity is coming free, as for StillTerminating; the
		// gang tries again after its preemption interval.
		r.Message = fmt.Sprintf("%s: %v", key.Subject(), err)
		return r
	}
	if err != nil {
		r.Err = err
		return r
	}
	if found == nil {
		r.Message = fmt.Sprintf("%s: preempting lower-priority pods would not make room either", key.Subject())
		return r
	}
	var msg string
	msg, r.Preempted = preemptionMessage(key, g, found)
	active, effects, stop := d.InstallGathered(c, g, found.Plan, pod, found.Pods, msg)
	r.Effects = append(r.Effects, effects)
	if stop != nil {
		r.Message, r.Preempted = stop.Message, 0
		return r
	}
	r.Evict, r.Nominate = active.ID, active.Slots[pod.UID]
	r.Message = msg + "; waiting for them to terminate"
	return r
}

// mayPreempt returns what planning the gang needs when it may search for
// victims now, and otherwise why not: it has a plan or backs off, it tried
// recently, or pods its last preemption evicted still terminate.
func (d Decisions) mayPreempt(c RecourseCycle, key Key, pod *v1.Pod, now time.Time, interval time.Duration) (*Planning, string, error) {
	admission := d.gangs.Admit(key, pod.CreationTimestamp.Time, now)
	if admission.Planning == nil {
		return nil, "gang has a plan or backs off", nil
	}
	if !d.gangs.PreemptionDue(key, now, interval) {
		return nil, fmt.Sprintf("%s tried preemption recently", key.Subject()), nil
	}
	if n, err := c.StillTerminating(key); err != nil {
		return nil, "", err
	} else if n > 0 {
		// Their capacity is coming free; evicting others now would only
		// add victims (the plan that waited for them timed out first).
		return nil, fmt.Sprintf("%s waits for %d pods it preempted to terminate", key.Subject(), n), nil
	}
	return admission.Planning, "", nil
}

// preemptionMessage announces the victims found for the gathered gang, and
// counts their GPUs.
func preemptionMessage(key Key, g *Gathered, found *Victims) (string, int64) {
	var gpus int64
	var names []string
	for _, u := range found.Units {
		gpus += u.GPUs
		names = append(names, u.Name)
	}
	sort.Strings(names)
	msg := fmt.Sprintf("%s preempts %d pods of %s (%d %s) to run in %s %s",
		key.Subject(), len(found.Pods), strings.Join(names, ", "), gpus, g.Request.GPU, found.Plan.Level, found.Plan.Domain)
	if found.Violations > 0 {
		msg += fmt.Sprintf(", exceeding PodDisruptionBudgets by %d pods (no choice keeps them)", found.Violations)
	}
	return msg, gpus
}
