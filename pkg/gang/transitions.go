package gang

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// The transitions of a gang's life: each one lock, each returning what the
// scheduler must do (Effects), never calling out.

// ReusableRefusal is a refusal for no room the gang's other members reuse
// instead of planning again (Planning.Reuse): what it was computed against
// and for how long it stands. (The record of the failed plan written on the
// gang's object for kubectl muster is FailedPlan.)
type ReusableRefusal struct {
	Epoch           Epoch
	Pending, Needed int
	Valid           time.Duration
}

// Refusal is why a gang cannot go ahead now. Its outcome sets the phase:
// OutcomeWaitingForMembers (fewer members than the quorum), OutcomeInvalid
// (it cannot be served as asked), OutcomeNotPossible (it can never be a
// gang and is placed pod by pod), OutcomeUnschedulable (no room).
type Refusal struct {
	Outcome Outcome
	Message string
	// Reuse, with OutcomeUnschedulable: the gang's other members reuse
	// the answer while nothing changed.
	Reuse *ReusableRefusal
	// Lead, with OutcomeUnschedulable: the member whose cycle planned the
	// gang and found no room (Manager.Lead).
	Lead *Member
}

// trigger is the lifecycle's name for r.
func (r Refusal) trigger() Trigger {
	switch r.Outcome {
	case OutcomeWaitingForMembers:
		return TriggerTooFewMembers
	case OutcomeUnschedulable:
		return TriggerNoRoom
	}
	return TriggerInvalid
}

// Refused: the gang cannot go ahead, for r (now: when that was decided).
// An active plan keeps its phase: another profile's cycle, or one member's
// own trouble, does not undo it.
func (m *Manager) Refused(key Key, r Refusal, now time.Time) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, now)
	m.move(key, s, r.trigger())
	if r.Reuse != nil {
		s.reusable = &reusableRefusal{epoch: r.Reuse.Epoch, shape: [2]int{r.Reuse.Pending, r.Reuse.Needed}, until: now.Add(r.Reuse.Valid), message: r.Message}
	}
	if r.Lead != nil {
		s.lead = leadMember{uid: r.Lead.UID, name: r.Lead.Name}
	}
	return Effects{Notice: s.notice(key, r.Outcome, r.Message)}
}

// HeldOut records whether a pod scheduled alone (key: its LoneKey) found
// no node because gang plans hold the capacity it needs (heldOut). No
// cluster event follows when such a plan is dropped, so while it is held
// out the drop wakes it with the gangs that found no room
// (PhaseUnschedulable), until it is bound or gone (Forget) or refused for
// another reason. Nothing is announced: the pod's own condition says why.
func (m *Manager) HeldOut(key Key, heldOut bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !heldOut {
		if s := m.gangs[key]; s != nil {
			m.move(key, s, TriggerNoLongerHeldOut)
		}
		return
	}
	m.move(key, m.get(key, now), TriggerNoRoom)
}

// Install makes plan the gang's active plan unless another one was set in
// the meantime (ok false): its slots are held from now on, its deadline
// timer set, and, unless it waits for victims, its other members (all but
// self) woken. message announces it: OutcomePreempting when the plan
// preempted, OutcomePlanned otherwise. Plans of lower priority it
// displaces are dropped in the same step (e.Displaced).
//
// present (nil: not asked) says what the informer's store shows of the
// plan's pods now, read under the manager's lock. A pod that left while
// the plan was made had its handler run before the plan existed (the
// store changes before any handler runs), so Install acts for it: a
// member that left, or one the plan counts on as bound that is neither
// bound nor in flight any more (its binding failed), drops the plan at
// once, before it displaces anything (e.Dropped says why); a victim that
// left is not waited for. A pod that leaves after this finds the plan
// installed, and its handler's transition acts on it.
func (m *Manager) Install(key Key, plan *ActivePlan, self types.UID, message string, seen time.Time, present Presence, base time.Duration) (e Effects, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	if s.plan != nil {
		return Effects{}, false
	}
	m.planID++
	plan.ID = m.planID
	m.setPlan(key, s, plan.copy()) // the caller keeps plan; the manager changes its own
	s.reusable = nil
	if present != nil {
		for uid := range s.plan.Victims {
			if !present.Victim(uid) {
				s.plan.Victims.Delete(uid)
			}
		}
	}
	if s.plan.Victims.Len() > 0 {
		m.move(key, s, TriggerInstalledWithVictims)
	} else {
		m.move(key, s, TriggerInstalled)
	}
	if present != nil {
		if cause, reason := m.leftWhilePlanning(s, present); reason != "" {
			return m.drop(key, plan.ID, cause, reason+" while the plan was made", plan.Created, base), true
		}
	}
	for uid := range s.plan.Victims {
		m.victimOf[uid] = victimRef{key: key, profile: plan.Profile}
	}
	e.Installed = plan.ID
	e.Timers = []Timer{{Key: key, Kind: TimerPlanDeadline, After: plan.Deadline.Sub(plan.Created), PlanID: plan.ID, Due: plan.Deadline}}
	e.Displaced = m.displace(key, plan.Priority, sets.New(slices.Collect(maps.Values(plan.Slots))...), plan.Created)
	outcome, reason := OutcomePlanned, WakePlanMade
	if plan.Victims.Len() > 0 { // the caller's: what it preempted
		s.preempted = s.plan.Evicted // read-only, as the plan's
		outcome, reason = OutcomePreempting, WakeVictimsGone
	}
	e.Notice = s.notice(key, outcome, message)
	if s.plan.Victims.Len() > 0 {
		return e, true
	}
	e.Wake = []Wake{{Key: key, Reason: reason, Plan: s.plan.copy(), Except: self}}
	return e, true
}

// Presence is what the informer's store shows of a plan's pods when
// Install asks (see Install).
type Presence interface {
	// Member names member uid and says whether it stands (neither deleted
	// nor terminating) and whether the API shows it bound.
	Member(uid types.UID) (name string, standing, bound bool)
	// Victim reports whether victim uid is still in the store.
	Victim(uid types.UID) bool
}

// leftWhilePlanning says why the plan just set for s cannot stand ("" when
// it can): a member it places or counts on left, or a member it counts on
// as bound is neither bound nor in flight. m.mu is held.
func (m *Manager) leftWhilePlanning(s *state, present Presence) (DropCause, string) {
	for _, uid := range append(slices.Sorted(maps.Keys(s.plan.Slots)), sets.List(s.plan.CountsOn)...) {
		if name, standing, _ := present.Member(uid); !standing {
			return DropMemberGone, fmt.Sprintf("member %s left", name)
		}
	}
	for _, uid := range sets.List(s.plan.CountsOn) {
		if _, inFlight := s.inFlight[uid]; inFlight {
			continue
		}
		if name, _, bound := present.Member(uid); !bound {
			return DropRejected, fmt.Sprintf("member %s, counted on as bound, failed to bind", name)
		}
	}
	return 0, ""
}

// displace: a plan of priority prio was installed for gang key on nodes.
// Plans of lower priority holding capacity there for members not yet
// reserved are dropped, without backoff and avoiding nothing: the new plan
// counted that capacity as free (HeldByOthers), as the framework counts
// lower-priority nominated pods, and the displaced gangs are planned again
// at once. m.mu is held.
func (m *Manager) displace(key Key, prio int32, nodes sets.Set[string], now time.Time) []Effects {
	var lower []Key
	for other, s := range m.planned {
		if other != key && s.plan.Priority < prio {
			lower = append(lower, other)
		}
	}
	slices.SortFunc(lower, compareKeys)
	var out []Effects
	for _, other := range lower {
		plan := m.planned[other].plan
		for uid, node := range plan.Slots {
			if !plan.Reserved.Has(uid) && nodes.Has(node) {
				reason := fmt.Sprintf("%s of priority %d was planned on node %s, where the plan held room for a member", key.Subject(), prio, node)
				out = append(out, m.drop(other, plan.ID, DropDisplaced, reason, now, 0))
				break
			}
		}
	}
	return out
}

// Reserved marks a member of plan planID reserved: from now on the
// scheduler cache counts it and the ledger stops holding its slot.
func (m *Manager) Reserved(key Key, planID int64, uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID {
		return
	}
	if _, ok := s.plan.Slots[uid]; ok {
		s.plan.Reserved.Insert(uid)
	}
}

// Arrival says what becomes of a member that reached Permit.
type Arrival int

const (
	// ArrivalDropped: the member's plan is gone; reject it.
	ArrivalDropped Arrival = iota
	// ArrivalWait: other members of the plan are not reserved yet.
	ArrivalWait
	// ArrivalComplete: this member completed the plan; everyone is allowed.
	ArrivalComplete
)

// Arrive: member uid of plan planID reached Permit, reserved. When that
// completes the plan before its deadline, the plan ends in the same step:
// the members are allowed and in flight (binding), and the plan holds
// nothing any more. Doing both under one lock means a plan is either
// completed or dropped, never both. A member that arrives after the
// deadline, before the deadline's timer fired, expires the plan itself (as
// Expire would, backing off from base). It returns a copy of the plan.
//
// check (nil: none) is asked before the plan is released.
//
// check.Live, when set, says whether a member's pod still stands (not deleted,
// not terminating) and, for the others, still waits at Permit: the
// framework rejects a deleted member waiting at Permit at once, and another
// profile's preemption turns a waiting member away in memory; muster
// learns of either only when its Unreserve or the deletion's handler runs.
// A plan this member would complete while a reserved member, this one
// included (deleted during its own cycle, its binding would fail), is no
// longer live is dropped instead, so the others do not bind without it.
//
// check.Quorum, when set, is the gang's quorum read by the caller just
// before (not under the manager's lock: reading it asks the manager for
// the gang's finished members): one raised above
// what the plan places and counts on (a PodGroup's minCount changed while
// its members were reserved) drops the plan, to be made again at once for
// the new quorum, instead of binding the gang below it.
func (m *Manager) Arrive(key Key, planID int64, uid types.UID, now time.Time, base time.Duration, check *ReleaseCheck) (Arrival, *ActivePlan, Effects) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID {
		return ArrivalDropped, nil, Effects{}
	}
	if !now.Before(s.plan.Deadline) {
		return ArrivalDropped, nil, m.drop(key, planID, DropTimeout, timedOut(s.plan), now, base)
	}
	if _, ok := s.plan.Slots[uid]; !ok {
		return ArrivalDropped, nil, Effects{}
	}
	s.plan.Reserved.Insert(uid)
	c := s.plan.copy()
	if s.plan.Reserved.Len() < len(s.plan.Slots) {
		if s.plan.Reserved.Len() > 1 {
			// Only the first member to wait hurries the others: from
			// every member it is a wake of the whole gang per member,
			// which a gang of 1000 pays for with a million activations.
			return ArrivalWait, c, Effects{}
		}
		return ArrivalWait, c, Effects{Wake: []Wake{{Key: key, Reason: WakeMemberWaiting, Plan: c, Except: uid}}}
	}
	if check != nil && check.Live != nil {
		for _, member := range sets.List(s.plan.Reserved) {
			if !check.Live(member) {
				reason := fmt.Sprintf("member %s is no longer waiting at Permit (deleted, or turned away)", member)
				if member == uid {
					reason = fmt.Sprintf("member %s was deleted during its own scheduling cycle", member)
				}
				return ArrivalDropped, nil, m.drop(key, planID, DropMemberGone, reason, now, base)
			}
		}
	}
	if check != nil && check.Quorum > 0 {
		if quorum, places := check.Quorum, len(s.plan.Slots)+s.plan.CountsOn.Len(); quorum > places {
			reason := fmt.Sprintf("the gang's quorum rose to %d while its plan for %d members was being reserved", quorum, places)
			return ArrivalDropped, nil, m.drop(key, planID, DropQuorumRaised, reason, now, base)
		}
	}
	m.setPlan(key, s, nil)
	m.move(key, s, TriggerCompleted)
	var e Effects
	for member, node := range c.Slots {
		s.inFlight[member] = node
		if member != uid { // allowed by its own Permit returning success
			e.Allow = append(e.Allow, member)
		}
	}
	slices.Sort(e.Allow)
	s.lastFailure = ""
	s.failures = 0
	e.StopDeadline = c.ID
	e.Notice = s.notice(key, OutcomeScheduled, fmt.Sprintf("%s: all %d planned members reserved on %d nodes in %s %s; binding",
		key.Subject(), len(c.Slots), c.Nodes, c.Level, c.Domain))
	return ArrivalComplete, c, e
}

// ReleaseCheck is what Arrive asks, under its lock, before it releases a
// plan (see Arrive).
type ReleaseCheck struct {
	Live   func(types.UID) bool
	Quorum int // 0: not known
}

// Drop drops the gang's plan planID (0: whatever plan it has): its
// holdings are released, its members waiting at Permit rejected, gangs that
// found no room retried (the capacity is free again), and the gang backs
// off unless the cause was not its doing. Each failure in a row doubles the
// backoff (base, 2×base, … up to 5 minutes), so a gang whose plan keeps
// breaking does not churn. No effects when there was no such plan.
func (m *Manager) Drop(key Key, planID int64, cause DropCause, reason string, now time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.drop(key, planID, cause, reason, now, base)
}

func (m *Manager) drop(key Key, planID int64, cause DropCause, reason string, now time.Time, base time.Duration) Effects {
	s := m.gangs[key]
	if s == nil || s.plan == nil || (planID != 0 && s.plan.ID != planID) {
		return Effects{}
	}
	plan := s.plan
	m.setPlan(key, s, nil)
	m.releases++
	// Victims not gone yet are no longer waited for: a victim whose
	// deletion failed may be chosen again by a later preemption.
	for uid := range plan.Victims {
		if ref, ok := m.victimOf[uid]; ok && ref.key == key {
			delete(m.victimOf, uid)
		}
	}
	if !cause.backsOff() {
		base = 0
	}
	backoff := min(base<<min(s.failures, 16), 5*time.Minute)
	retry := PlannedAgainAtOnce
	if cause.backsOff() {
		s.failures++
		retry = fmt.Sprintf("(retry in %s)", backoff)
	}
	m.move(key, s, cause.trigger())
	s.backoffUntil = now.Add(backoff)
	s.lastFailure = reason
	msg := fmt.Sprintf("%s: %s; released all %d planned members %s", key.Subject(), reason, len(plan.Slots), retry)
	e := Effects{
		StopDeadline: plan.ID,
		Dropped:      &Drop{Key: key, Cause: cause, Reason: reason, Backoff: backoff},
		Reject:       &Rejection{Key: key, Members: plan.Slots, Reserved: sets.List(plan.Reserved), Message: msg},
		Notice:       s.notice(key, cause.Outcome(), msg),
		Timers:       []Timer{{Key: key, Kind: TimerBackoffEnded, After: backoff, Due: s.backoffUntil}},
	}
	for other := range m.unschedulable {
		e.Wake = append(e.Wake, Wake{Key: other, Reason: WakeCapacityFreed, AllProfiles: true})
	}
	slices.SortFunc(e.Wake, func(a, b Wake) int { return compareKeys(a.Key, b.Key) })
	return e
}

func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// Expire drops plan planID if it did not complete before its deadline.
func (m *Manager) Expire(key Key, planID int64, now time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID {
		return Effects{}
	}
	return m.drop(key, planID, DropTimeout, timedOut(s.plan), now, base)
}

// TimerFired: timer t, set by an earlier transition, fired (at t.Due). A
// plan's deadline drops the plan if it has not completed (Expire); the end
// of a backoff or of an avoidance wakes the gang's pending members in
// every profile (a plan of one profile may displace a gang of another).
func (m *Manager) TimerFired(t Timer, base time.Duration) Effects {
	switch t.Kind {
	case TimerPlanDeadline:
		return m.Expire(t.Key, t.PlanID, t.Due, base)
	case TimerBackoffEnded:
		return Effects{Wake: []Wake{{Key: t.Key, Reason: WakeBackoffEnded, AllProfiles: true}}}
	case TimerAvoidEnded:
		return Effects{Wake: []Wake{{Key: t.Key, Reason: WakeAvoidEnded, AllProfiles: true}}}
	}
	return Effects{}
}

// timedOut is why plan p was dropped at its deadline.
func timedOut(p *ActivePlan) string {
	return fmt.Sprintf("timed out after %s with %d of %d members reserved",
		p.Deadline.Sub(p.Created).Round(time.Second), p.Reserved.Len(), len(p.Slots))
}

// Rejected: member uid of plan planID was rejected at Reserve or Permit,
// or failed to bind, on node. It is no longer in flight. If the plan is
// still active, muster did not reject it: the node refused it (another
// plugin's Reserve or Permit, the framework's timeout), so the next plans
// avoid that pair until avoidUntil, or the same plan comes back after the
// backoff. The plan is dropped, and so is a newer plan of the gang that
// counted on the member bound (an allowed member that failed to bind).
func (m *Manager) Rejected(key Key, planID int64, uid types.UID, name, node string, now, avoidUntil time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	var avoided []Timer
	if s := m.gangs[key]; s != nil {
		m.leftFlight(key, s, uid)
		if s.plan != nil && s.plan.ID == planID {
			s.plan.Reserved.Delete(uid) // it left the plan: no Permit of its waits
			avoided = append(avoided, m.avoid(s, key, node, now, avoidUntil, uid))
		} else if s.plan != nil && s.plan.CountsOn.Has(uid) {
			planID = s.plan.ID
		}
	}
	e := m.drop(key, planID, DropRejected, fmt.Sprintf("member %s was rejected or failed to bind on node %s", name, node), now, base)
	e.Timers = append(e.Timers, avoided...)
	return e
}

// PlanBroken: member uid could not go to its planned node in plan planID
// (why). With avoid the (member, node) pair is kept out of plans until
// avoidUntil: a real cycle's filters refused it there.
func (m *Manager) PlanBroken(key Key, planID int64, uid types.UID, node, reason string, avoid bool, now, avoidUntil time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	var avoided []Timer
	if s := m.gangs[key]; s != nil && avoid {
		avoided = append(avoided, m.avoid(s, key, node, now, avoidUntil, uid))
	}
	e := m.drop(key, planID, DropPlanBroken, reason, now, base)
	e.Timers = append(e.Timers, avoided...)
	return e
}

// NodeChanged: node can no longer take what plan planID planned on it
// (why). Every member of the gang avoids the node until avoidUntil, not
// only those planned there: the snapshot the next plan reads may still show
// it. The plan is dropped without backoff: the change was not the gang's
// doing.
func (m *Manager) NodeChanged(key Key, planID int64, node, why string, now, avoidUntil time.Time) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID {
		return Effects{}
	}
	avoided := m.avoid(s, key, node, now, avoidUntil, slices.Collect(maps.Keys(s.plan.Slots))...)
	e := m.drop(key, planID, DropNodeChanged, fmt.Sprintf("planned node %s %s", node, why), now, 0)
	e.Timers = append(e.Timers, avoided)
	return e
}

// MemberGone: a member left (deleted, or finished: the informer holds live
// pods only). It is no longer in flight; a plan that placed it, or counted
// on it bound to reach the quorum, is dropped.
func (m *Manager) MemberGone(key Key, uid types.UID, name string, now time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil {
		return Effects{}
	}
	m.leftFlight(key, s, uid)
	if s.plan == nil {
		return Effects{}
	}
	if _, planned := s.plan.Slots[uid]; !planned && !s.plan.CountsOn.Has(uid) {
		return Effects{}
	}
	what := "member"
	if key.Kind == KindPod {
		what = "pod"
	}
	return m.drop(key, s.plan.ID, DropMemberGone, fmt.Sprintf("%s %s was deleted or finished", what, name), now, base)
}

// move is the one place a gang's phase changes: the lifecycle says where
// t takes it from its phase, and a trigger with no row there leaves it
// (a refusal while a plan is active, say). The index of unschedulable
// gangs follows it.
func (m *Manager) move(key Key, s *state, t Trigger) {
	to, ok := phaseAfter(s.phase, t)
	if !ok {
		return
	}
	s.phase = to
	if to == PhaseUnschedulable {
		m.unschedulable.Insert(key)
	} else {
		m.unschedulable.Delete(key)
	}
}

// setPlan is the one place a gang's active plan changes (nil: none), so
// the index of planned gangs follows it.
func (m *Manager) setPlan(key Key, s *state, plan *ActivePlan) {
	s.plan = plan
	if plan != nil {
		m.planned[key] = s
	} else {
		delete(m.planned, key)
	}
}

// leftFlight: member uid, if allowed and binding, will not be seen bound
// (it failed to bind, or was deleted). The gang is no longer on its way to
// Bound: the member is placed again by a new plan, without backoff.
func (m *Manager) leftFlight(key Key, s *state, uid types.UID) {
	if _, ok := s.inFlight[uid]; !ok {
		return
	}
	delete(s.inFlight, uid)
	m.move(key, s, TriggerAllowedMemberLeft)
}

// MemberBound: a member was seen bound; once every member the last plan
// allowed is, the gang is bound.
func (m *Manager) MemberBound(key Key, uid types.UID, seen time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	delete(s.inFlight, uid)
	if len(s.inFlight) == 0 {
		m.move(key, s, TriggerAllBound)
	}
}

// Succeed records a member that finished successfully; it counts toward the
// gang's quorum from now on. It reports whether the member was new. A gang
// the manager no longer knows (forgotten: its object is gone) counts
// nothing: a success read after that must not start a new gang of the same
// name with it.
func (m *Manager) Succeed(key Key, uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.succeeded.Has(uid) {
		return false
	}
	s.succeeded.Insert(uid)
	return true
}

// avoid keeps members uids of the gang off node in the plans made before
// until, so a plan the framework rejected is never simply made again; the
// timer it returns wakes the gang when that ends.
func (m *Manager) avoid(s *state, key Key, node string, now, until time.Time, uids ...types.UID) Timer {
	if s.avoid == nil {
		s.avoid = map[types.UID]map[string]time.Time{}
	}
	for _, uid := range uids {
		if s.avoid[uid] == nil {
			s.avoid[uid] = map[string]time.Time{}
		}
		s.avoid[uid][node] = until
	}
	return Timer{Key: key, Kind: TimerAvoidEnded, After: until.Sub(now), Due: until}
}

// VictimGone: a preempted pod is gone. Only the profile whose plan waited
// for it acts (each profile wakes its own pods); when that plan waits for
// nothing more, its members go ahead.
func (m *Manager) VictimGone(uid types.UID, profile string) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	ref, ok := m.victimOf[uid]
	if !ok || ref.profile != profile {
		return Effects{}
	}
	delete(m.victimOf, uid)
	s := m.gangs[ref.key]
	if s == nil || s.plan == nil || !s.plan.Victims.Has(uid) {
		return Effects{}
	}
	s.plan.Victims.Delete(uid)
	if s.plan.Victims.Len() > 0 {
		return Effects{}
	}
	m.move(ref.key, s, TriggerVictimsGone)
	return Effects{Wake: []Wake{{Key: ref.key, Reason: WakeVictimsGone, Plan: s.plan.copy()}}}
}

// TryPreemption reports whether preemption may be tried for the gang now,
// and if so records the try: at most once per interval.
func (m *Manager) TryPreemption(key Key, now time.Time, interval time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, now)
	if !preemptionDue(s, now, interval) {
		return false
	}
	s.lastPreemption = now
	return true
}

// PreemptionDue is TryPreemption without recording a try: a cycle asks it
// before gathering the gang, which costs more than the answer.
func (m *Manager) PreemptionDue(key Key, now time.Time, interval time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	return s == nil || preemptionDue(s, now, interval)
}

func preemptionDue(s *state, now time.Time, interval time.Duration) bool {
	return s.lastPreemption.IsZero() || now.Sub(s.lastPreemption) >= interval
}

// Forget drops a gang that has no pods left. It reports whether the gang
// was known. A plan still active (installed by a cycle that ran while the
// last pods went) is released as any dropped plan is: the gangs that found
// no room are woken, the victims it waited for are no longer protected.
// Nothing is announced of the gang, and no timer of its is set.
func (m *Manager) Forget(key Key, now time.Time) (e Effects, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, known = m.gangs[key]
	e = m.drop(key, 0, DropMemberGone, "its pods are gone", now, 0)
	e.Notice, e.Timers = nil, nil
	delete(m.gangs, key)
	m.unschedulable.Delete(key)
	return e, known
}
