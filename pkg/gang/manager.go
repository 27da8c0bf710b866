package gang

import (
	"maps"
	"math"
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
// Each transition (Refused, Install, Reserved, Arrive, Drop, Expire,
// Rejected, PlanBroken, MemberGone, MemberBound, NodeChanged, VictimGone,
// HeldOut) is one method
// under one lock that returns its Effects: whom to wake and why, the notice
// to publish, the members to allow or reject at Permit, the timers to set.
// The manager never calls out; the scheduler plugin carries the effects
// out. One Manager serves every profile of a scheduler, so each profile
// sees the capacity the others' plans hold.
type Manager struct {
	mu    sync.Mutex
	gangs map[Key]*state
	// planned are the gangs with an active plan (setPlan): what the
	// holdings and the lookups by member or node read, without walking
	// every gang the scheduler knows (most of them run bound).
	planned map[Key]*state
	// unschedulable are the gangs in PhaseUnschedulable (move): a dropped
	// plan's capacity wakes them.
	unschedulable sets.Set[Key]
	planID        int64
	victimOf      map[types.UID]victimRef
	// releases counts dropped plans: capacity a plan held and the
	// scheduler's snapshot does not show being freed.
	releases uint64
}

type victimRef struct {
	key     Key
	profile string
}

// Epoch is what a refusal for no room was computed against: the scheduler
// snapshot's generation, the number of plans dropped so far and the sum of
// the pending members' generations (a pod's generation grows with every
// change of its spec: a toleration added, a resize). A sibling's failure is
// reused only within the same epoch.
type Epoch struct {
	Snapshot int64
	Releases uint64
	Members  int64
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
	// reusable is the last refusal for no room, so the gang's other
	// members do not plan again while nothing changed.
	reusable *reusableRefusal
	// preempted are the pods the gang's last preemption evicted, kept
	// after its plan is gone: while one still terminates, the gang does
	// not evict others.
	preempted sets.Set[types.UID]
	// lead is the member whose cycle last planned the gang and found no
	// room (Lead).
	lead leadMember
}

type leadMember struct {
	uid  types.UID
	name string
}

type reusableRefusal struct {
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
	// Quorum is the gang's quorum when planned.
	Quorum int
	// Priority is the gang's (its lowest member's): what the plan holds
	// is kept from pods and gangs of no higher priority only, as the
	// framework counts nominated pods against pods of their priority or
	// lower.
	Priority int32
	// CountsOn are the members bound (or binding) when planned: the plan
	// places only what the quorum needs beside them, so one of them
	// leaving before the plan completes breaks it (read-only).
	CountsOn sets.Set[types.UID]
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
	return &Manager{gangs: map[Key]*state{}, planned: map[Key]*state{}, unschedulable: sets.New[Key](), victimOf: map[types.UID]victimRef{}}
}

func (m *Manager) get(key Key, seen time.Time) *state {
	s := m.gangs[key]
	if s == nil {
		s = &state{phase: phaseStart, firstSeen: seen, inFlight: map[types.UID]string{}, succeeded: sets.New[types.UID]()}
		m.gangs[key] = s
		m.move(key, s, TriggerFirstSeen)
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

// FirstSeen returns when the gang was first seen, recording seen if it is
// new. The value never changes while the gang exists, which keeps the queue
// order of its pods stable.
func (m *Manager) FirstSeen(key Key, seen time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.get(key, seen).firstSeen
}

// Phase is the gang's phase (PhasePending for a gang not seen).
func (m *Manager) Phase(key Key) Phase {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		return s.phase
	}
	return PhasePending
}

// Lead names the member that carries the wakes of a gang waiting for room
// (PhaseUnschedulable): the one whose cycle last planned it and found none.
// A cluster event that may make room needs to requeue that member only:
// its cycle plans the gang again, and a plan it makes wakes the others.
// ok is false for a gang in any other phase, or never refused for room.
func (m *Manager) Lead(key Key) (uid types.UID, name string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gangs[key]
	if s == nil || s.phase != PhaseUnschedulable || s.lead.uid == "" {
		return "", "", false
	}
	return s.lead.uid, s.lead.name, true
}

// Admission is what a member's cycle needs of its gang: whether it backs
// off, its active plan, and, when it has none, what planning it needs.
type Admission struct {
	// BackoffUntil and Why: the gang backs off until then, after Why.
	BackoffUntil time.Time
	Why          string
	// Plan is a copy of the active plan, nil when none.
	Plan *ActivePlan
	// Planning is set when the gang has no plan and does not back off.
	Planning *Planning
}

// Planning is what planning a gang needs of the manager, read at Admit,
// except the other gangs' holdings: a member that reuses its sibling's
// refusal (Reuse) never reads them, and summing them walks every plan.
type Planning struct {
	// Releases counts the plans dropped so far (Epoch.Releases).
	Releases uint64
	// Avoided are the gang's (member, node) pairs to keep out of the plan.
	Avoided map[types.UID]map[string]bool
	// InFlight maps the gang's members allowed but not yet seen bound to
	// their nodes.
	InFlight map[types.UID]string
	reusable *reusableRefusal

	// Priority is the planned gang's (set before HeldByOthers is read):
	// plans of lower priority hold nothing from it.
	Priority int32

	manager *Manager
	key     Key
	held    map[string]Resources
	heldOK  bool
}

// HeldByOthers is what the other gangs' plans of Priority or higher hold,
// per node (HeldForOthers), read at the first call: the plan and its
// explanation count the same holdings.
func (p *Planning) HeldByOthers() map[string]Resources {
	if !p.heldOK {
		p.held, p.heldOK = p.manager.HeldForOthers(p.key, p.Priority), true
	}
	return p.held
}

// Reuse returns the gang's last refusal for no room if it was computed in
// the same epoch, for the same pending and needed members, and is still
// valid at now: the gang's other members reuse it instead of planning again.
func (p *Planning) Reuse(epoch Epoch, pending, needed int, now time.Time) (string, bool) {
	return p.reusable.answers(epoch, pending, needed, now)
}

// Admit records the gang as seen and returns what its member's cycle
// needs of it at now, in one step.
func (m *Manager) Admit(key Key, seen, now time.Time) Admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(key, seen)
	a := Admission{BackoffUntil: s.backoffUntil, Why: s.lastFailure}
	switch {
	case s.plan != nil:
		a.Plan = s.plan.copy()
	case !now.Before(s.backoffUntil):
		a.Planning = &Planning{Releases: m.releases, Avoided: m.avoided(s, now), InFlight: maps.Clone(s.inFlight), reusable: s.reusable, manager: m, key: key}
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
	for key, s := range m.planned {
		if _, ok := s.plan.Slots[uid]; ok {
			return key, s.plan.copy()
		}
	}
	return Key{}, nil
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
	return m.avoided(m.gangs[key], now)
}

func (m *Manager) avoided(s *state, now time.Time) map[types.UID]map[string]bool {
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
	// Level and Domain are the topology domain the plan placed the gang in.
	Level, Domain string
}

// PlansOn lists the active plans with a member planned on node.
func (m *Manager) PlansOn(node string) []NodePlan {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []NodePlan
	for key, s := range m.planned {
		var members []types.UID
		for uid, n := range s.plan.Slots {
			if n == node {
				members = append(members, uid)
			}
		}
		if len(members) > 0 {
			out = append(out, NodePlan{Key: key, PlanID: s.plan.ID, Members: members, Profile: s.plan.Profile, Level: s.plan.Level, Domain: s.plan.Domain})
		}
	}
	return out
}

// answers is the refusal's message if it answers for epoch, pending and
// needed at now. Nil-safe.
func (u *reusableRefusal) answers(epoch Epoch, pending, needed int, now time.Time) (string, bool) {
	if u == nil || u.epoch != epoch || u.shape != [2]int{pending, needed} || !now.Before(u.until) {
		return "", false
	}
	return u.message, true
}

// Preempted returns the pods the gang's last preemption evicted (nil when
// it never preempted), whether its plan is still active or not.
func (m *Manager) Preempted(key Key) sets.Set[types.UID] {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		return s.preempted.Clone()
	}
	return nil
}

// PreemptedGone forgets the pods the gang's last preemption evicted: none
// of them is left.
func (m *Manager) PreemptedGone(key Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.gangs[key]; s != nil {
		s.preempted = nil
	}
}

// IsVictim reports whether a pod was chosen as a victim by a plan that
// still waits for it.
func (m *Manager) IsVictim(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.victimOf[uid]
	return ok
}

// AnyPriority asks Held and HeldForOthers for the holdings of every plan.
const AnyPriority int32 = math.MinInt32

// Holding is what an active plan holds on a node for one member not yet
// reserved.
type Holding struct {
	UID     types.UID
	Request Resources
}

// Held lists, per node, what every active plan of priority prio or higher
// holds for members not yet reserved (reserved members are counted by the
// scheduler cache, so they are never subtracted twice): what a pod of
// priority prio scheduled alone must leave free.
func (m *Manager) Held(prio int32) map[string][]Holding {
	m.mu.Lock()
	defer m.mu.Unlock()
	var held map[string][]Holding
	m.eachHolding(nil, prio, func(node string, h Holding) {
		if held == nil {
			held = map[string][]Holding{}
		}
		held[node] = append(held[node], h)
	})
	return held
}

// HeldForOthers sums, per node, what every active plan of priority prio
// or higher but gang key's holds for members not yet reserved.
func (m *Manager) HeldForOthers(key Key, prio int32) map[string]Resources {
	m.mu.Lock()
	defer m.mu.Unlock()
	var held map[string]Resources
	m.eachHolding(&key, prio, func(node string, h Holding) {
		if held == nil {
			held = map[string]Resources{}
		}
		sum := held[node]
		sum.Add(h.Request)
		held[node] = sum
	})
	return held
}

// eachHolding calls f for every member slot an active plan of priority
// minPriority or higher (but exclude's) holds.
func (m *Manager) eachHolding(exclude *Key, minPriority int32, f func(node string, h Holding)) {
	for key, s := range m.planned {
		if (exclude != nil && key == *exclude) || s.plan.Priority < minPriority {
			continue
		}
		for uid, node := range s.plan.Slots {
			if !s.plan.Reserved.Has(uid) {
				f(node, Holding{UID: uid, Request: s.plan.Requests[uid]})
			}
		}
	}
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

// Sizes counts what the manager keeps, by structure: the gangs it knows,
// those planned and unplaceable, the victims plans wait for, and over every
// gang the members in flight, the members that finished, the (member,
// node) pairs to avoid and the pods its last preemption evicted. A gang
// whose pods are all gone is forgotten (Forget), so on a cluster whose
// gangs come and go each count returns to what the gangs present need.
func (m *Manager) Sizes() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{"gangs": len(m.gangs), "gangs planned": len(m.planned), "gangs unplaceable": m.unschedulable.Len(),
		"victims awaited": len(m.victimOf), "members in flight": 0, "members succeeded": 0, "gangs' preempted pods": 0,
		"avoided (member, node) pairs": 0}
	for _, s := range m.gangs {
		out["members in flight"] += len(s.inFlight)
		out["members succeeded"] += s.succeeded.Len()
		out["gangs' preempted pods"] += s.preempted.Len()
		for _, nodes := range s.avoid {
			out["avoided (member, node) pairs"] += len(nodes)
		}
	}
	return out
}
