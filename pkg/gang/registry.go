package gang

import (
	"maps"
	"slices"
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
	mu       sync.Mutex
	gangs    map[Key]*state
	planID   int64
	victimOf map[types.UID]victimRef
	// releases counts dropped plans: capacity the ledger held and the
	// scheduler's snapshot does not show being freed.
	releases uint64
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
	// unplaceable remembers the last failed plan, so the gang's other
	// members do not plan again while nothing changed.
	unplaceable *unplaceable
}

type unplaceable struct {
	epoch   Epoch
	shape   [2]int // pending members, needed
	until   time.Time
	message string
}

// ActivePlan is a plan being carried out: members are steered to their slots
// and reserved one by one; the gang is released at Permit when all are.
type ActivePlan struct {
	Plan
	// ID tells plans apart (set by SetPlan).
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

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{gangs: map[Key]*state{}, victimOf: map[types.UID]victimRef{}}
}

func (r *Registry) get(key Key, seen time.Time) *state {
	s := r.gangs[key]
	if s == nil {
		s = &state{firstSeen: seen, inFlight: map[types.UID]string{}, succeeded: sets.New[types.UID]()}
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

// Failing lists gangs without a plan whose latest outcome is outcome, e.g.
// the gangs that could not be placed, to retry when capacity frees up.
func (r *Registry) Failing(outcome Outcome) []Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []Key
	for k, s := range r.gangs {
		if s.plan == nil && s.lastOutcome == outcome {
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
		c.Victims = s.plan.Victims.Clone()
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

// InFlight maps the members allowed but not yet seen bound to their nodes.
func (r *Registry) InFlight(key Key) map[types.UID]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[types.UID]string{}
	if s := r.gangs[key]; s != nil {
		for uid, node := range s.inFlight {
			out[uid] = node
		}
	}
	return out
}

// Succeed records a member that finished successfully; it counts toward the
// gang's quorum from now on. It reports whether the member was new.
func (r *Registry) Succeed(key Key, uid types.UID, seen time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(key, seen)
	if s.succeeded.Has(uid) {
		return false
	}
	s.succeeded.Insert(uid)
	return true
}

// Succeeded is how many members this scheduler saw finish successfully.
func (r *Registry) Succeeded(key Key) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil {
		return s.succeeded.Len()
	}
	return 0
}

// Avoid records that member uid failed on node in a real scheduling cycle:
// plans made before until do not put it there again, so a plan the
// framework rejected is never simply made again.
func (r *Registry) Avoid(key Key, uid types.UID, node string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(key, until)
	if s.avoid == nil {
		s.avoid = map[types.UID]map[string]time.Time{}
	}
	if s.avoid[uid] == nil {
		s.avoid[uid] = map[string]time.Time{}
	}
	s.avoid[uid][node] = until
}

// Avoided returns the gang's (member, node) pairs still to avoid at now.
func (r *Registry) Avoided(key Key, now time.Time) map[types.UID]map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.gangs[key]
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

// PlanOf finds the active plan that has a slot for member uid.
func (r *Registry) PlanOf(uid types.UID) (Key, *ActivePlan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, s := range r.gangs {
		if s.plan != nil {
			if _, ok := s.plan.Slots[uid]; ok {
				c := *s.plan
				c.Reserved = s.plan.Reserved.Clone()
				c.Victims = s.plan.Victims.Clone()
				return key, &c
			}
		}
	}
	return Key{}, nil
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
	s.unplaceable = nil
	for uid := range plan.Victims {
		r.victimOf[uid] = victimRef{key: key, profile: plan.Profile}
	}
	return true
}

// NodePlan is an active plan's use of one node.
type NodePlan struct {
	Key    Key
	PlanID int64
	// Members are the plan's members planned on the node; Gang all its
	// planned members.
	Members, Gang []types.UID
	Profile       string
}

// PlansOn lists the active plans with a member planned on node.
func (r *Registry) PlansOn(node string) []NodePlan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []NodePlan
	for key, s := range r.gangs {
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
			out = append(out, NodePlan{Key: key, PlanID: s.plan.ID, Members: members, Gang: slices.Collect(maps.Keys(s.plan.Slots)), Profile: s.plan.Profile})
		}
	}
	return out
}

// Releases is how many plans were dropped so far.
func (r *Registry) Releases() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.releases
}

// SetUnplaceable records that planning the gang (pending members, needed)
// in epoch failed with message; its other members reuse the answer while
// the epoch is the same, for at most valid.
func (r *Registry) SetUnplaceable(key Key, epoch Epoch, pending, needed int, message string, now time.Time, valid time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.get(key, now).unplaceable = &unplaceable{epoch: epoch, shape: [2]int{pending, needed}, until: now.Add(valid), message: message}
}

// Unplaceable returns the gang's last planning failure if it was computed
// in the same epoch, for the same pending and needed members, and is still
// valid at now.
func (r *Registry) Unplaceable(key Key, epoch Epoch, pending, needed int, now time.Time) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.gangs[key]
	if s == nil || s.unplaceable == nil {
		return "", false
	}
	u := s.unplaceable
	if u.epoch != epoch || u.shape != [2]int{pending, needed} || !now.Before(u.until) {
		return "", false
	}
	return u.message, true
}

// IsVictim reports whether a pod was chosen as a victim by a plan that
// still waits for it.
func (r *Registry) IsVictim(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.victimOf[uid]
	return ok
}

// VictimGone records that a preempted pod is gone, when the plan waiting
// for it belongs to profile (each profile wakes its own pods). It returns
// the gang whose plan waited for it and whether that plan now waits for
// nothing.
func (r *Registry) VictimGone(uid types.UID, profile string) (Key, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, ok := r.victimOf[uid]
	if !ok || ref.profile != profile {
		return Key{}, false
	}
	key := ref.key
	delete(r.victimOf, uid)
	s := r.gangs[key]
	if s == nil || s.plan == nil || !s.plan.Victims.Has(uid) {
		return key, false
	}
	s.plan.Victims.Delete(uid)
	return key, s.plan.Victims.Len() == 0
}

// TryPreemption reports whether preemption may be tried for the gang now:
// at most once per interval.
func (r *Registry) TryPreemption(key Key, now time.Time, interval time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(key, now)
	if !s.lastPreemption.IsZero() && now.Sub(s.lastPreemption) < interval {
		return false
	}
	s.lastPreemption = now
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
	for uid := range c.Reserved {
		s.inFlight[uid] = c.Slots[uid]
	}
	s.lastFailure = ""
	s.failures = 0
	return PermitComplete, &c
}

// Fail drops the gang's active plan if its ID is planID (0 matches any
// plan), backs the gang off and records why. Each failure in a row doubles
// the backoff (base, 2×base, … up to 5 minutes), so a gang whose plan keeps
// breaking does not churn; a base of 0 (a drop that was not the gang's
// doing) neither backs off nor counts. It returns the dropped plan and the backoff, or
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
	r.releases++ // the capacity it held is free again
	// Victims not gone yet are no longer waited for: a victim whose
	// deletion failed may be chosen again by a later preemption.
	for uid := range plan.Victims {
		if ref, ok := r.victimOf[uid]; ok && ref.key == key {
			delete(r.victimOf, uid)
		}
	}
	backoff := min(base<<min(s.failures, 16), 5*time.Minute)
	if base > 0 {
		s.failures++ // a drop that is not the gang's doing does not count
	}
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
		delete(s.inFlight, uid)
	}
}

// Notice records the gang's latest outcome and its explanation and reports
// whether they differ from the previous ones, so each change is announced
// once.
func (r *Registry) Notice(key Key, outcome Outcome, message string, seen time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(key, seen)
	if s.lastNotice == message && s.lastOutcome == outcome {
		return false
	}
	s.lastNotice, s.lastOutcome = message, outcome
	return true
}

// LastNotice returns the gang's latest outcome and its explanation.
func (r *Registry) LastNotice(key Key) (outcome Outcome, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.gangs[key]; s != nil {
		return s.lastOutcome, s.lastNotice
	}
	return "", ""
}
