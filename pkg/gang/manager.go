package gang

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Manager is the life of every gang the scheduler has seen, as one state
// machine: its phase, its active plan and the capacity that plan holds,
// members allowed but not yet seen bound, backoff after a failure, the
// (member, node) pairs to avoid and what was last announced.
//
// Each transition (Install, Reserved, Arrive, Drop, Expire, MemberGone,
// NodeChanged, VictimGone, Unplaceable, Waiting, Invalid) is one method
// under one lock that returns its Effects: whom to wake and why, the notice
// to publish, the members to allow or reject at Permit, the timers to set.
// The manager never calls out; the scheduler plugin carries the effects
// out. One Manager serves every profile of a scheduler, so each profile
// sees the capacity the others' plans hold.
type Manager struct {
	mu       sync.Mutex
	gangs    map[Key]*state
	planID   int64
	victimOf map[types.UID]victimRef
	// releases counts dropped plans: capacity a plan held and the
	// scheduler's snapshot does not show being freed.
	releases uint64
}

// Phase is where a gang is in its life.
type Phase int

const (
	// PhaseNew: seen, nothing decided yet.
	PhaseNew Phase = iota
	// PhaseWaitingForMembers: fewer pods than the quorum can be placed.
	PhaseWaitingForMembers
	// PhaseInvalid: the gang's spec or annotations cannot be served.
	PhaseInvalid
	// PhaseUnplaceable: the last plan found no room; capacity freed by
	// another gang retries it.
	PhaseUnplaceable
	// PhasePreempting: planned, waiting for the pods it preempted to go.
	PhasePreempting
	// PhasePlanned: the plan holds its slots; members are being reserved.
	PhasePlanned
	// PhasePermitted: every planned member was reserved and allowed; they
	// are binding.
	PhasePermitted
	// PhaseBound: every member the last plan allowed was seen bound.
	PhaseBound
	// PhaseBackingOff: its plan was dropped; it waits before planning again.
	PhaseBackingOff
	// PhaseDropped: its plan was dropped by a change that was not its
	// doing (a planned node changed); it is planned again at once.
	PhaseDropped
)

var phaseNames = [...]string{
	PhaseNew: "New", PhaseWaitingForMembers: "WaitingForMembers", PhaseInvalid: "Invalid", PhaseUnplaceable: "Unplaceable",
	PhasePreempting: "Preempting", PhasePlanned: "Planned", PhasePermitted: "Permitted", PhaseBound: "Bound",
	PhaseBackingOff: "BackingOff", PhaseDropped: "Dropped",
}

func (p Phase) String() string { return phaseNames[p] }

// DropCause says why a plan was dropped: the outcome announced, whether
// the gang backs off, and the label of the rejections metric.
type DropCause int

const (
	// DropTimeout: the deadline passed before every member was reserved.
	DropTimeout DropCause = iota
	// DropRejected: a member was rejected at Reserve or Permit, or failed
	// to bind.
	DropRejected
	// DropMemberGone: a planned member was deleted or finished.
	DropMemberGone
	// DropPlanBroken: a member could not go to its planned node.
	DropPlanBroken
	// DropNodeChanged: a planned node was deleted, cordoned, started being
	// reclaimed or stopped matching its member.
	DropNodeChanged
)

var dropCauseNames = [...]string{
	DropTimeout:     "timeout",
	DropRejected:    "rejected",
	DropMemberGone:  "member_deleted",
	DropPlanBroken:  "plan_broken",
	DropNodeChanged: "node_changed",
}

func (c DropCause) String() string { return dropCauseNames[c] }

// backsOff reports whether the gang waits before it is planned again: not
// when the cluster changed under a plan that was fine.
func (c DropCause) backsOff() bool { return c != DropNodeChanged }

// Outcome is what the drop is announced as.
func (c DropCause) Outcome() Outcome {
	if c == DropTimeout {
		return OutcomeTimedOut
	}
	return OutcomeRejected
}

// WakeReason says why pods of a gang go to the active queue.
type WakeReason int

const (
	// WakePlanMade: a plan was installed in one member's cycle; its other
	// planned members are sent to their slots now.
	WakePlanMade WakeReason = iota
	// WakeMemberWaiting: a member reached Permit and waits there; the
	// planned members not reserved yet are hurried so the wait is short.
	WakeMemberWaiting
	// WakeVictimsGone: the last pod preempted for the gang's plan is gone;
	// its planned members go ahead.
	WakeVictimsGone
	// WakeCapacityFreed: another gang's plan was dropped and the capacity
	// it held is free; gangs that found no room try again.
	WakeCapacityFreed
	// WakeBackoffEnded: the backoff after the gang's own plan was dropped
	// is over.
	WakeBackoffEnded
	// WakeAvoidEnded: a (member, node) pair a Filter rejected may be
	// planned again.
	WakeAvoidEnded
	// WakeQuorumReached: a new pending member completed the gang's quorum;
	// PreEnqueue held the others back until now.
	WakeQuorumReached
	// WakeMemberSucceeded: a PodGroup member finished successfully and
	// counts toward the quorum, so the rest need fewer members.
	WakeMemberSucceeded
	// WakeOwnerChanged: the gang's Job, StatefulSet or PodGroup was added
	// or changed in a way that can change its quorum.
	WakeOwnerChanged
	numWakeReasons
)

// wakeReasonNames are the reasons' log values and metric labels.
var wakeReasonNames = [numWakeReasons]string{
	WakePlanMade:        "plan_made",
	WakeMemberWaiting:   "member_waiting",
	WakeVictimsGone:     "victims_gone",
	WakeCapacityFreed:   "capacity_freed",
	WakeBackoffEnded:    "backoff_ended",
	WakeAvoidEnded:      "avoid_ended",
	WakeQuorumReached:   "quorum_reached",
	WakeMemberSucceeded: "member_succeeded",
	WakeOwnerChanged:    "owner_changed",
}

// WakeReasons lists every reason, in order.
func WakeReasons() []WakeReason {
	out := make([]WakeReason, numWakeReasons)
	for r := range out {
		out[r] = WakeReason(r)
	}
	return out
}

func (r WakeReason) String() string {
	if r < 0 || r >= numWakeReasons {
		return "unknown"
	}
	return wakeReasonNames[r]
}

// Effects are what a transition asks of the scheduler, carried out in the
// order of the fields.
type Effects struct {
	// StopDeadline is a plan whose deadline timer is no longer needed (0:
	// none).
	StopDeadline int64
	// Dropped is the plan a drop released.
	Dropped *Drop
	// Reject turns members waiting at Permit away.
	Reject *Rejection
	// Allow lets members waiting at Permit bind: their plan completed.
	Allow []types.UID
	// Notice is the gang's new outcome to announce; nil when it did not
	// change (each change is announced once).
	Notice *Notice
	// Wake sends gangs' pending members to the active queue.
	Wake []Wake
	// Timers to set.
	Timers []Timer
}

// Drop is a plan a drop released.
type Drop struct {
	Key     Key
	Plan    *ActivePlan
	Cause   DropCause
	Reason  string
	Backoff time.Duration
}

// Rejection turns away the gang's members waiting at Permit: those in
// Members, or every waiting member of the gang when Members is nil.
type Rejection struct {
	Key     Key
	Members map[types.UID]string
	Message string
}

// Notice is a gang's outcome and its explanation.
type Notice struct {
	Key     Key
	Outcome Outcome
	Message string
}

// Wake asks for pending members of a gang: all of them, or with Plan set
// only its members not reserved yet, except Except (the pod whose cycle is
// running). AllProfiles: the members of every profile, not only the one
// that carries the effects out.
type Wake struct {
	Key         Key
	Reason      WakeReason
	Plan        *ActivePlan
	Except      types.UID
	AllProfiles bool
}

// TimerKind says what a timer does when it fires.
type TimerKind int

const (
	// TimerPlanDeadline expires plan PlanID (Manager.Expire).
	TimerPlanDeadline TimerKind = iota
	// TimerBackoffEnded wakes the gang's pending members (WakeBackoffEnded).
	TimerBackoffEnded
	// TimerAvoidEnded wakes the gang's pending members (WakeAvoidEnded).
	TimerAvoidEnded
)

// Timer is a timer to set.
type Timer struct {
	Key    Key
	Kind   TimerKind
	After  time.Duration
	PlanID int64
}

type victimRef struct {
	key     Key
	profile string
}

// Epoch is what a failed plan was computed against: the scheduler
// snapshot's generation and the number of plans dropped so far. A sibling's
// failure is reused only within the same epoch.
type Epoch struct {
	Snapshot int64
	Releases uint64
}

type state struct {
	phase        Phase
	firstSeen    time.Time
	plan         *ActivePlan
	inFlight     map[types.UID]string // allowed, binding: member → node
	succeeded    sets.Set[types.UID]
	avoid        map[types.UID]map[string]time.Time // (member, node) → until
	backoffUntil time.Time
	lastFailure  string
	lastNotice   string
	lastOutcome  Outcome
	failures     int
	// lastPreemption is when preemption was last tried for the gang, so
	// every member's failed cycle does not search again.
	lastPreemption time.Time
	// failedPlan remembers the last failed plan, so the gang's other
	// members do not plan again while nothing changed.
	failedPlan *failedAttempt
}

type failedAttempt struct {
	epoch   Epoch
	shape   [2]int // pending members, needed
	until   time.Time
	message string
}

// ActivePlan is a plan being carried out: members are steered to their slots
// and reserved one by one; the gang is released at Permit when all are.
type ActivePlan struct {
	Plan
	// ID tells plans apart (set by Install).
	ID       int64
	Requests map[types.UID]Resources
	Reserved sets.Set[types.UID]
	// Victims are the pods preempted for this plan that have not gone yet;
	// members are held back until they have.
	Victims sets.Set[types.UID]
	// Evicted are all pods preempted for this plan, gone or not (read-only):
	// the plugin's informer may see a victim go before the scheduler's cache
	// does.
	Evicted sets.Set[types.UID]
	// Profile is the scheduler profile whose pods the plan places.
	Profile  string
	Created  time.Time
	Deadline time.Time
	// Quorum is the gang's quorum when planned; Bound the members already
	// bound then. Recorded for explanations.
	Quorum, Bound int
}

// copy is a copy of the plan the caller may keep: the sets that change
// are cloned; Slots and Requests never change and are shared.
func (p *ActivePlan) copy() *ActivePlan {
	c := *p
	c.Reserved = p.Reserved.Clone()
	c.Victims = p.Victims.Clone()
	return &c
}

// NewManager returns a manager that has seen no gang.
func NewManager() *Manager {
	return &Manager{gangs: map[Key]*state{}, victimOf: map[types.UID]victimRef{}}
}

func (m *Manager) get(key Key, seen time.Time) *state {
	s := m.gangs[key]
	if s == nil {
		s = &state{firstSeen: seen, inFlight: map[types.UID]string{}, succeeded: sets.New[types.UID]()}
		m.gangs[key] = s
	}
	return s
}

// notice records the gang's outcome and returns it for announcing, or nil
// when it is the one already announced.
func (s *state) notice(key Key, outcome Outcome, message string) *Notice {
	if s.lastNotice == message && s.lastOutcome == outcome {
		return nil
	}
	s.lastNotice, s.lastOutcome = message, outcome
	return &Notice{Key: key, Outcome: outcome, Message: message}
}

// ---- Queries: read-only, each one lock.

// FirstSeen returns when the gang was first seen, recording seen if it is
// new. The value never changes while the gang exists, which keeps the queue
// order of its pods stable.
func (m *Manager) FirstSeen(key Key, seen time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.get(key, seen).firstSeen
}

// Phase is the gang's phase (PhaseNew for a gang not seen).
func (m *Manager) Phase(key Key) Phase {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		return s.phase
	}
	return PhaseNew
}

// Admission is what a member's cycle needs of its gang first: whether it
// backs off, and its active plan.
type Admission struct {
	// BackoffUntil and Why: the gang backs off until then, after Why.
	BackoffUntil time.Time
	Why          string
	// Plan is a copy of the active plan, nil when none.
	Plan *ActivePlan
}

// Admit records the gang as seen and returns what its member's cycle
// needs of it.
func (m *Manager) Admit(key Key, seen time.Time) Admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	a := Admission{BackoffUntil: s.backoffUntil, Why: s.lastFailure}
	if s.plan != nil {
		a.Plan = s.plan.copy()
	}
	return a
}

// Plan returns a copy of the gang's active plan (nil when none).
func (m *Manager) Plan(key Key) *ActivePlan {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil && s.plan != nil {
		return s.plan.copy()
	}
	return nil
}

// PlanOf finds the active plan that has a slot for member uid.
func (m *Manager) PlanOf(uid types.UID) (Key, *ActivePlan) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, s := range m.gangs {
		if s.plan != nil {
			if _, ok := s.plan.Slots[uid]; ok {
				return key, s.plan.copy()
			}
		}
	}
	return Key{}, nil
}

// Backoff returns until when the gang backs off and why.
func (m *Manager) Backoff(key Key) (time.Time, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		return s.backoffUntil, s.lastFailure
	}
	return time.Time{}, ""
}

// InFlight maps the members allowed but not yet seen bound to their nodes.
func (m *Manager) InFlight(key Key) map[types.UID]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil && len(s.inFlight) > 0 {
		return maps.Clone(s.inFlight)
	}
	return nil
}

// Succeeded is how many members this scheduler saw finish successfully.
func (m *Manager) Succeeded(key Key) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		return s.succeeded.Len()
	}
	return 0
}

// Avoided returns the gang's (member, node) pairs still to avoid at now.
func (m *Manager) Avoided(key Key, now time.Time) map[types.UID]map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || len(s.avoid) == 0 {
		return nil
	}
	out := map[types.UID]map[string]bool{}
	for uid, nodes := range s.avoid {
		for node, until := range nodes {
			if now.Before(until) {
				if out[uid] == nil {
					out[uid] = map[string]bool{}
				}
				out[uid][node] = true
			} else {
				delete(nodes, node)
			}
		}
		if len(nodes) == 0 {
			delete(s.avoid, uid)
		}
	}
	return out
}

// NodePlan is an active plan's use of one node.
type NodePlan struct {
	Key    Key
	PlanID int64
	// Members are the plan's members planned on the node.
	Members []types.UID
	Profile string
}

// PlansOn lists the active plans with a member planned on node.
func (m *Manager) PlansOn(node string) []NodePlan {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []NodePlan
	for key, s := range m.gangs {
		if s.plan == nil {
			continue
		}
		var members []types.UID
		for uid, n := range s.plan.Slots {
			if n == node {
				members = append(members, uid)
			}
		}
		if len(members) > 0 {
			out = append(out, NodePlan{Key: key, PlanID: s.plan.ID, Members: members, Profile: s.plan.Profile})
		}
	}
	return out
}

// Releases is how many plans were dropped so far.
func (m *Manager) Releases() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.releases
}

// FailedPlan returns the gang's last planning failure if it was computed
// in the same epoch, for the same pending and needed members, and is still
// valid at now: the gang's other members reuse it instead of planning again.
func (m *Manager) FailedPlan(key Key, epoch Epoch, pending, needed int, now time.Time) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.failedPlan == nil {
		return "", false
	}
	u := s.failedPlan
	if u.epoch != epoch || u.shape != [2]int{pending, needed} || !now.Before(u.until) {
		return "", false
	}
	return u.message, true
}

// IsVictim reports whether a pod was chosen as a victim by a plan that
// still waits for it.
func (m *Manager) IsVictim(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.victimOf[uid]
	return ok
}

// Held sums, per node, what every active plan holds for members not yet
// reserved (reserved members are counted by the scheduler cache, so they
// are never subtracted twice): what pods scheduled alone must leave free.
func (m *Manager) Held() map[string]Resources {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held(nil)
}

// HeldForOthers is Held without the plan of gang key itself.
func (m *Manager) HeldForOthers(key Key) map[string]Resources {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held(&key)
}

func (m *Manager) held(exclude *Key) map[string]Resources {
	var held map[string]Resources
	for key, s := range m.gangs {
		if s.plan == nil || (exclude != nil && key == *exclude) {
			continue
		}
		for uid, node := range s.plan.Slots {
			if s.plan.Reserved.Has(uid) {
				continue
			}
			if held == nil {
				held = map[string]Resources{}
			}
			h := held[node]
			h.Add(s.plan.Requests[uid])
			held[node] = h
		}
	}
	return held
}

// LastNotice returns the gang's latest outcome and its explanation.
func (m *Manager) LastNotice(key Key) (outcome Outcome, message string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		return s.lastOutcome, s.lastNotice
	}
	return "", ""
}

// ---- Transitions: each one lock, returning what the scheduler must do.

// Waiting: the gang has fewer members than its quorum (at: when that was
// decided).
func (m *Manager) Waiting(key Key, message string, at time.Time) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, at)
	s.phase = PhaseWaitingForMembers
	return Effects{Notice: s.notice(key, OutcomeWaitingForMembers, message)}
}

// Invalid: the gang cannot be served as asked (outcome OutcomeInvalid), or
// can never be a gang and is placed pod by pod (OutcomeNotPossible).
func (m *Manager) Invalid(key Key, outcome Outcome, message string, now time.Time) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, now)
	s.phase = PhaseInvalid
	return Effects{Notice: s.notice(key, outcome, message)}
}

// FailedAttempt is a failed plan other members may reuse (FailedPlan):
// what it was computed against and for how long it stands.
type FailedAttempt struct {
	Epoch           Epoch
	Pending, Needed int
	Valid           time.Duration
}

// Unplaceable: planning the gang found no room. With reuse set, the
// gang's other members reuse the answer while nothing changed.
func (m *Manager) Unplaceable(key Key, message string, now time.Time, reuse *FailedAttempt) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, now)
	s.phase = PhaseUnplaceable
	if reuse != nil {
		s.failedPlan = &failedAttempt{epoch: reuse.Epoch, shape: [2]int{reuse.Pending, reuse.Needed}, until: now.Add(reuse.Valid), message: message}
	}
	return Effects{Notice: s.notice(key, OutcomeUnschedulable, message)}
}

// Install makes plan the gang's active plan unless another one was set in
// the meantime (ok false): its slots are held from now on, its deadline
// timer set, and, unless it waits for victims, its other members (all but
// self) woken. message announces it: OutcomePreempting when the plan
// preempted, OutcomePlanned otherwise.
func (m *Manager) Install(key Key, plan *ActivePlan, self types.UID, message string, seen time.Time) (e Effects, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	if s.plan != nil {
		return Effects{}, false
	}
	m.planID++
	plan.ID = m.planID
	s.plan = plan
	s.failedPlan = nil
	for uid := range plan.Victims {
		m.victimOf[uid] = victimRef{key: key, profile: plan.Profile}
	}
	e.Timers = []Timer{{Key: key, Kind: TimerPlanDeadline, After: plan.Deadline.Sub(plan.Created), PlanID: plan.ID}}
	if plan.Victims.Len() > 0 {
		s.phase = PhasePreempting
		e.Notice = s.notice(key, OutcomePreempting, message)
		return e, true
	}
	s.phase = PhasePlanned
	e.Notice = s.notice(key, OutcomePlanned, message)
	e.Wake = []Wake{{Key: key, Reason: WakePlanMade, Plan: plan.copy(), Except: self}}
	return e, true
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
// completed or dropped, never both. It returns a copy of the plan.
func (m *Manager) Arrive(key Key, planID int64, uid types.UID, now time.Time) (Arrival, *ActivePlan, Effects) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID || !now.Before(s.plan.Deadline) {
		return ArrivalDropped, nil, Effects{}
	}
	if _, ok := s.plan.Slots[uid]; !ok {
		return ArrivalDropped, nil, Effects{}
	}
	s.plan.Reserved.Insert(uid)
	c := s.plan.copy()
	if s.plan.Reserved.Len() < len(s.plan.Slots) {
		return ArrivalWait, c, Effects{Wake: []Wake{{Key: key, Reason: WakeMemberWaiting, Plan: c, Except: uid}}}
	}
	s.plan = nil
	s.phase = PhasePermitted
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
	e.Notice = s.notice(key, OutcomeScheduled, fmt.Sprintf("gang %s: all %d planned members reserved on %d nodes in %s %s; binding",
		key, len(c.Slots), c.Nodes, c.Level, c.Domain))
	return ArrivalComplete, c, e
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
	s.plan = nil
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
	s.phase = PhaseDropped
	if base > 0 {
		s.failures++
		s.phase = PhaseBackingOff
	}
	s.backoffUntil = now.Add(backoff)
	s.lastFailure = reason
	msg := fmt.Sprintf("gang %s: %s; released all %d planned members (retry in %s)", key, reason, len(plan.Slots), backoff)
	e := Effects{
		StopDeadline: plan.ID,
		Dropped:      &Drop{Key: key, Plan: plan, Cause: cause, Reason: reason, Backoff: backoff},
		Reject:       &Rejection{Key: key, Members: plan.Slots, Message: msg},
		Notice:       s.notice(key, cause.Outcome(), msg),
		Timers:       []Timer{{Key: key, Kind: TimerBackoffEnded, After: backoff}},
	}
	for other, os := range m.gangs {
		if os.phase == PhaseUnplaceable {
			e.Wake = append(e.Wake, Wake{Key: other, Reason: WakeCapacityFreed, AllProfiles: true})
		}
	}
	slices.SortFunc(e.Wake, func(a, b Wake) int { return compareKeys(a.Key, b.Key) })
	return e
}

func compareKeys(a, b Key) int {
	if a.Kind != b.Kind {
		return compareStrings(string(a.Kind), string(b.Kind))
	}
	if a.Namespace != b.Namespace {
		return compareStrings(a.Namespace, b.Namespace)
	}
	return compareStrings(a.Name, b.Name)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Expire drops plan planID if it did not complete before its deadline.
func (m *Manager) Expire(key Key, planID int64, now time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID {
		return Effects{}
	}
	p := s.plan
	reason := fmt.Sprintf("timed out after %s with %d of %d members reserved",
		p.Deadline.Sub(p.Created).Round(time.Second), p.Reserved.Len(), len(p.Slots))
	return m.drop(key, planID, DropTimeout, reason, now, base)
}

// Rejected: member uid of plan planID was rejected at Reserve or Permit,
// or failed to bind, on node. It is no longer in flight. If the plan is
// still active, muster did not reject it: the node refused it (another
// plugin's Reserve or Permit, the framework's timeout), so the next plans
// avoid that pair until avoidUntil, or the same plan comes back after the
// backoff. The plan is dropped.
func (m *Manager) Rejected(key Key, planID int64, uid types.UID, name, node string, now, avoidUntil time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	var e Effects
	if s := m.gangs[key]; s != nil {
		delete(s.inFlight, uid)
		if s.plan != nil && s.plan.ID == planID {
			e = m.avoid(s, key, node, now, avoidUntil, uid)
		}
	}
	d := m.drop(key, planID, DropRejected, fmt.Sprintf("member %s was rejected or failed to bind on node %s", name, node), now, base)
	return d.with(e)
}

// PlanBroken: member uid could not go to its planned node in plan planID
// (why). With avoid the (member, node) pair is kept out of plans until
// avoidUntil: a real cycle's filters refused it there.
func (m *Manager) PlanBroken(key Key, planID int64, uid types.UID, node, reason string, avoid bool, now, avoidUntil time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	var e Effects
	if s := m.gangs[key]; s != nil && avoid {
		e = m.avoid(s, key, node, now, avoidUntil, uid)
	}
	return m.drop(key, planID, DropPlanBroken, reason, now, base).with(e)
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
	avoid := m.avoid(s, key, node, now, avoidUntil, slices.Collect(maps.Keys(s.plan.Slots))...)
	return m.drop(key, planID, DropNodeChanged, fmt.Sprintf("planned node %s %s", node, why), now, 0).with(avoid)
}

// MemberGone: a member left (deleted, or finished: the informer holds live
// pods only). It is no longer in flight; a plan that placed it is dropped.
func (m *Manager) MemberGone(key Key, uid types.UID, name string, now time.Time, base time.Duration) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil {
		return Effects{}
	}
	delete(s.inFlight, uid)
	if s.plan == nil {
		return Effects{}
	}
	if _, planned := s.plan.Slots[uid]; !planned {
		return Effects{}
	}
	what := "member"
	if key.Kind == KindPod {
		what = "pod"
	}
	return m.drop(key, s.plan.ID, DropMemberGone, fmt.Sprintf("%s %s was deleted or finished", what, name), now, base)
}

// MemberBound: a member was seen bound; once every member the last plan
// allowed is, the gang is bound.
func (m *Manager) MemberBound(key Key, uid types.UID, seen time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	delete(s.inFlight, uid)
	if s.phase == PhasePermitted && len(s.inFlight) == 0 {
		s.phase = PhaseBound
	}
}

// Succeed records a member that finished successfully; it counts toward the
// gang's quorum from now on. It reports whether the member was new.
func (m *Manager) Succeed(key Key, uid types.UID, seen time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	if s.succeeded.Has(uid) {
		return false
	}
	s.succeeded.Insert(uid)
	return true
}

// Avoid: members uids failed on node in a real scheduling cycle; plans
// made before until do not put them there again, so a plan the framework
// rejected is never simply made again. The gang is woken when that ends.
func (m *Manager) Avoid(key Key, node string, now, until time.Time, uids ...types.UID) Effects {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.avoid(m.get(key, now), key, node, now, until, uids...)
}

func (m *Manager) avoid(s *state, key Key, node string, now, until time.Time, uids ...types.UID) Effects {
	if s.avoid == nil {
		s.avoid = map[types.UID]map[string]time.Time{}
	}
	for _, uid := range uids {
		if s.avoid[uid] == nil {
			s.avoid[uid] = map[string]time.Time{}
		}
		s.avoid[uid][node] = until
	}
	return Effects{Timers: []Timer{{Key: key, Kind: TimerAvoidEnded, After: until.Sub(now)}}}
}

// with is e followed by the effects of other.
func (e Effects) with(other Effects) Effects {
	e.Timers = append(e.Timers, other.Timers...)
	e.Wake = append(e.Wake, other.Wake...)
	e.Allow = append(e.Allow, other.Allow...)
	if e.Notice == nil {
		e.Notice = other.Notice
	}
	return e
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
	s.phase = PhasePlanned
	return Effects{Wake: []Wake{{Key: ref.key, Reason: WakeVictimsGone, Plan: s.plan.copy()}}}
}

// TryPreemption reports whether preemption may be tried for the gang now:
// at most once per interval.
func (m *Manager) TryPreemption(key Key, now time.Time, interval time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, now)
	if !s.lastPreemption.IsZero() && now.Sub(s.lastPreemption) < interval {
		return false
	}
	s.lastPreemption = now
	return true
}

// Forget drops a gang that has no pods left.
func (m *Manager) Forget(key Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.gangs, key)
}
