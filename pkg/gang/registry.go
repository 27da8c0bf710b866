package gang

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Registry is the in-memory state of every gang the scheduler has seen: when
// it was first seen (the queue order), its active plan, the ledger of
// capacity that plan holds, members allowed but not yet seen bound, and
// backoff after a failure. All methods are safe for concurrent use and never
// call out while holding the lock.
type Registry struct {
	mu     sync.Mutex
	gangs  map[Key]*state
	planID int64
}

type state struct {
	firstSeen    time.Time
	plan         *ActivePlan
	inFlight     sets.Set[types.UID]
	backoffUntil time.Time
	lastFailure  string
	lastNotice   string
	lastReason   string
	failures     int
}

// ActivePlan is a plan being carried out: members are steered to their slots
// and reserved one by one; the gang is released at Permit when all are.
type ActivePlan struct {
	Plan
	// ID tells plans apart (set by SetPlan).
	ID       int64
	Requests map[types.UID]Resources
	Reserved sets.Set[types.UID]
	Created  time.Time
	Deadline time.Time
	// Quorum is the gang's quorum when planned; Bound the members already
	// bound then. Recorded for explanations.
	Quorum, Bound int
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{gangs: map[Key]*state{}}
}

func (r *Registry) get(key Key, seen time.Time) *state {
	s := r.gangs[key]
	if s == nil {
		s = &state{firstSeen: seen, inFlight: sets.New[types.UID]()}
		r.gangs[key] = s
	}
	return s
}

// FirstSeen returns when the gang was first seen, recording seen if it is
// new. The value never changes while the gang exists, which keeps the queue
// order of its pods stable.
func (r *Registry) FirstSeen(key Key, seen time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.get(key, seen).firstSeen
}

// Failing lists gangs without a plan whose latest explanation has reason,
// e.g. the gangs that could not be placed, to retry when capacity frees up.
func (r *Registry) Failing(reason string) []Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []Key
	for k, s := range r.gangs {
		if s.plan == nil && s.lastReason == reason {
			keys = append(keys, k)
		}
	}
	return keys
}

// Forget drops a gang that has no pods left.
func (r *Registry) Forget(key Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.gangs, key)
}

// Plan returns a copy of the gang's active plan (nil when none). Slots and
// Requests are shared and must be treated as read-only.
func (r *Registry) Plan(key Key) *ActivePlan {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil && s.plan != nil {
		c := *s.plan
		c.Reserved = s.plan.Reserved.Clone()
		return &c
	}
	return nil
}

// Backoff returns until when the gang backs off and why.
func (r *Registry) Backoff(key Key) (time.Time, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil {
		return s.backoffUntil, s.lastFailure
	}
	return time.Time{}, ""
}

// InFlight is how many members were allowed but are not yet seen bound.
func (r *Registry) InFlight(key Key) sets.Set[types.UID] {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil {
		return s.inFlight.Clone()
	}
	return sets.New[types.UID]()
}

// SetPlan makes plan the gang's active plan unless another one was set in
// the meantime; it reports whether plan was installed.
func (r *Registry) SetPlan(key Key, plan *ActivePlan, seen time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(key, seen)
	if s.plan != nil {
		return false
	}
	r.planID++
	plan.ID = r.planID
	s.plan = plan
	return true
}

// Held sums, per node, what active plans of gangs other than exclude hold for
// members not yet reserved (reserved members are counted by the scheduler
// cache, so they are never subtracted twice).
func (r *Registry) Held(exclude Key) map[string]Resources {
	r.mu.Lock()
	defer r.mu.Unlock()
	var held map[string]Resources
	for key, s := range r.gangs {
		if key == exclude || s.plan == nil {
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

// Reserve marks a member of plan planID reserved: from now on the scheduler
// cache counts it and the ledger stops holding its slot.
func (r *Registry) Reserve(key Key, planID int64, uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID {
		return
	}
	if _, ok := s.plan.Slots[uid]; ok {
		s.plan.Reserved.Insert(uid)
	}
}

// PermitOutcome says what Permit should do with a member.
type PermitOutcome int

const (
	// PermitDropped: the member's plan is gone; reject it.
	PermitDropped PermitOutcome = iota
	// PermitWait: other members of the plan are not reserved yet.
	PermitWait
	// PermitComplete: this member completed the plan; allow everyone.
	PermitComplete
)

// Permit marks member uid of plan planID reserved and, when that completes
// the plan before its deadline, ends it in the same step: the members become
// in flight (allowed, binding) and the plan holds nothing any more. Doing both
// under one lock means a plan is either completed or failed, never both.
func (r *Registry) Permit(key Key, planID int64, uid types.UID, now time.Time) (PermitOutcome, *ActivePlan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.gangs[key]
	if s == nil || s.plan == nil || s.plan.ID != planID || !now.Before(s.plan.Deadline) {
		return PermitDropped, nil
	}
	if _, ok := s.plan.Slots[uid]; !ok {
		return PermitDropped, nil
	}
	s.plan.Reserved.Insert(uid)
	c := *s.plan
	c.Reserved = s.plan.Reserved.Clone()
	if s.plan.Reserved.Len() < len(s.plan.Slots) {
		return PermitWait, &c
	}
	s.plan = nil
	s.inFlight = s.inFlight.Union(c.Reserved)
	s.lastFailure = ""
	s.failures = 0
	return PermitComplete, &c
}

// Fail drops the gang's active plan if its ID is planID (0 matches any
// plan), backs the gang off and records why. Each failure in a row doubles
// the backoff (base, 2×base, … up to 5 minutes), so a gang whose plan keeps
// breaking does not churn. It returns the dropped plan and the backoff, or
// nil if nothing was dropped.
func (r *Registry) Fail(key Key, planID int64, reason string, now time.Time, base time.Duration) (*ActivePlan, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.gangs[key]
	if s == nil || s.plan == nil || (planID != 0 && s.plan.ID != planID) {
		return nil, 0
	}
	plan := s.plan
	s.plan = nil
	backoff := min(base<<min(s.failures, 16), 5*time.Minute)
	s.failures++
	s.backoffUntil = now.Add(backoff)
	s.lastFailure = reason
	return plan, backoff
}

// Settled removes a member from the in-flight set once it is seen bound,
// deleted, or its binding failed.
func (r *Registry) Settled(key Key, uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil {
		s.inFlight.Delete(uid)
	}
}

// Notice records the gang's latest explanation and reports whether it
// differs from the previous one, so each change is announced once.
func (r *Registry) Notice(key Key, reason, message string, seen time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(key, seen)
	if s.lastNotice == message && s.lastReason == reason {
		return false
	}
	s.lastNotice, s.lastReason = message, reason
	return true
}

// LastNotice returns the gang's latest explanation.
func (r *Registry) LastNotice(key Key) (reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil {
		return s.lastReason, s.lastNotice
	}
	return "", ""
}
