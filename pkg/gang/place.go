package gang

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Placing a member: the gang's side of one scheduling cycle. Place keeps
// the order of the steps and the gang's state; what only the scheduler
// knows (its informers, the framework's filters, the cycle's snapshot) it
// asks of a Cycle, the port the scheduler plugin implements for each cycle.

// Decisions are what a member's cycle decides about its gang: Place
// (PreFilter), Unplaced and Preempt (PostFilter). Each calls the scheduler
// through the cycle's port between the Manager's transitions; the Manager
// is the state machine and never calls out.
type Decisions struct{ gangs *Manager }

// Decisions returns the decisions of members' cycles over m's gangs.
func (m *Manager) Decisions() Decisions { return Decisions{gangs: m} }

// Cycle is the scheduler's side of one member's scheduling cycle: what
// every decision about the member asks.
type Cycle interface {
	// Now reads the scheduler's clock.
	Now() time.Time
	// Profile names the scheduler profile the cycle runs in; BackoffBase
	// is its first backoff after a dropped plan.
	Profile() string
	BackoffBase() time.Duration
	// Resolve names pod's gang (inGang false: the pod is scheduled alone).
	Resolve(pod *v1.Pod) (info *Resolved, inGang bool, err error)
	// Ended reports whether the gang has no pod left (Forget).
	Ended(key Key) bool
	// Gather reads what planning the gang of pod needs, or why it cannot
	// be planned now. The cycle keeps it: Presence, TryPlan and
	// SearchVictims work on what it gathered last.
	Gather(pod *v1.Pod, info *Resolved, planning *Planning) (*Gathered, *Refusal)
	// Presence is what the informers show of the gathered gang's pods and
	// the victims now (Install).
	Presence(victims []*v1.Pod) Presence
}

// PlacingCycle is the scheduler's side of a member's cycle for Place.
type PlacingCycle interface {
	Cycle
	// PriorityOf is the priority of a pod scheduled alone: the plans it
	// must leave alone are those of this priority or higher. RequestOf is
	// what the pod takes on a node, GPUs of its claims included.
	PriorityOf(pod *v1.Pod) int32
	RequestOf(pod *v1.Pod) Resources
	// Snapshot reads the cycle's nodes for planning, and the generation
	// of what the planner sees of them.
	Snapshot() (generation int64, err error)
	// ReleaseWaiting turns away the gang's members still waiting at
	// Permit (from a plan dropped as they entered it) and counts them.
	ReleaseWaiting(key Key, message string) int
	// TryPlan plans what Gather gathered on the Snapshot, each choice
	// confirmed by the profile's filters.
	TryPlan(planning *Planning) Attempt
	// VictimsLingering says what plan, whose victims are all deleted,
	// still waits for ("" when nothing): the cycle's snapshot still shows
	// one on a planned node, or the devices they held are not released.
	VictimsLingering(plan *ActivePlan) string
}

// Gathered is what planning a gang needs, read once per plan by
// Cycle.Gather.
type Gathered struct {
	Info *Resolved
	// Request is the planner's (its Check set per attempt).
	Request Request
	// Pending is how many members the plan places; Alone: the gang's
	// quorum is bound and only the cycle's pod is placed.
	Pending int
	Alone   bool
	// Generations sums the placed members' generations: a changed spec
	// is a new epoch.
	Generations int64
	// CountsOn are the members bound (or binding) that the plan joins.
	CountsOn []types.UID
	// Priority is the gang's, its lowest member's; Never names a member
	// that may not preempt.
	Priority int32
	Never    string
}

// Attempt is one planning of a gathered gang (PlacingCycle.TryPlan).
type Attempt struct {
	Plan *Plan
	// Message says why there is no plan.
	Message string
	// Screened: no framework filter refused a node; the planner's own
	// screening decided, so the answer stands while the epoch does.
	Screened bool
	// FailedPlan tallies the nodes for the gang's record; asked only when
	// the failure is news.
	FailedPlan func() *FailedPlan
}

// Stop is why a member's cycle stops short of a node.
type Stop struct {
	Message string
	// Retry: the cycle may pass soon with no cluster event (the framework's
	// Unschedulable, not UnschedulableAndUnresolvable).
	Retry bool
	// Err: the cycle itself failed.
	Err error
}

// Placement is where Place sends a member, and what the scheduler must do
// for it.
type Placement struct {
	// Info is the pod's gang (nil when it could not be resolved).
	Info *Resolved
	Key  Key
	// Plan is the gang's active plan; Node the member's slot there, set
	// when the member is steered or HeldBack for the plan's victims.
	// Planned: the plan was made in this cycle.
	Plan     *ActivePlan
	Node     string
	HeldBack bool
	Planned  bool
	// Held, for a pod scheduled alone with no plan, is the capacity gang
	// plans hold that it must leave alone; Request, read only then, what
	// the pod takes.
	Held    map[string][]Holding
	Request Resources
	// Stop is set when the member does not go ahead.
	Stop *Stop
	// Followup's notices go on Info.Ref. FailedPlan is the gang's new
	// failed plan to record.
	Followup
	FailedPlan *FailedPlan
	// PodEvents are outcomes to record on the pod itself.
	PodEvents []Notice
}

// Followup is what the scheduler carries out after a decision.
type Followup struct {
	// Effects are the transitions' effects, in order.
	Effects []Effects
	// Forgotten are the gangs forgotten because they had ended: their
	// timers go too.
	Forgotten []Key
}

// forgetIfEnded forgets the gang of key when it has no pod left, releasing
// what it still held.
func (f *Followup) forgetIfEnded(m *Manager, c Cycle, key Key) {
	if !c.Ended(key) {
		return
	}
	e, known := m.Forget(key, c.Now())
	f.Effects = append(f.Effects, e)
	if known {
		f.Forgotten = append(f.Forgotten, key)
	}
}

// reuseRefusal bounds how long a gang's members reuse a sibling's refusal
// for no room when nothing observable changed: long enough for one wave of
// sibling cycles, short enough that nothing unobserved is missed for long.
const reuseRefusal = 2 * time.Second

// Place decides where pod goes in this cycle: steered to its slot in its
// gang's plan (made now when the gang has none and does not back off),
// held back while the plan waits for victims, or refused, the gang's
// refusal recorded.
func (d Decisions) Place(c PlacingCycle, pod *v1.Pod) (pl Placement) {
	info, inGang, err := c.Resolve(pod)
	pl.Info = info
	if err != nil && !inGang {
		pl.PodEvents = append(pl.PodEvents, Notice{Key: LoneKey(pod), Outcome: OutcomeInvalid, Message: err.Error()})
		pl.Stop = &Stop{Message: err.Error()}
		return pl
	}
	if !inGang {
		pl.Key = LoneKey(pod)
		if plan := d.gangs.Plan(pl.Key); plan != nil {
			d.steer(c, &pl, pod, plan)
			return pl
		}
		if pl.Held = d.gangs.Held(c.PriorityOf(pod)); len(pl.Held) > 0 {
			pl.Request = c.RequestOf(pod)
		}
		return pl
	}
	pl.Key = info.Key
	defer pl.forgetIfEnded(d.gangs, c, info.Key)
	if err != nil {
		d.refuse(c, &pl, Refusal{Outcome: OutcomeInvalid, Message: err.Error()}, nil)
		return pl
	}
	if info.NoGang != "" {
		// Said, not refused: its pods are placed one by one (quorum 1).
		pl.Effects = append(pl.Effects, d.gangs.Refused(info.Key, Refusal{Outcome: OutcomeNotPossible, Message: info.NoGang}, c.Now()))
		pl.PodEvents = append(pl.PodEvents, Notice{Key: info.Key, Outcome: OutcomeNotPossible, Message: info.NoGang})
	}
	// One reading of the clock: Admit and this check must agree on
	// whether the gang still backs off (Planning is set only when not).
	now := c.Now()
	admission := d.gangs.Admit(info.Key, pod.CreationTimestamp.Time, now)
	if until := admission.BackoffUntil; now.Before(until) {
		pl.Stop = &Stop{Message: fmt.Sprintf("gang %s backs off until %s after: %s", info.Key, until.Format(time.RFC3339), admission.Why)}
		return pl
	}
	plan := admission.Plan
	if plan == nil {
		if plan = d.planGang(c, &pl, pod, admission.Planning); plan == nil {
			return pl
		}
	}
	d.steer(c, &pl, pod, plan)
	return pl
}

// planGang plans the gang of pod and installs the plan; nil when pl.Stop
// says why not.
func (d Decisions) planGang(c PlacingCycle, pl *Placement, pod *v1.Pod, planning *Planning) *ActivePlan {
	info := pl.Info
	g, r := c.Gather(pod, info, planning)
	if r != nil {
		d.refuse(c, pl, *r, nil)
		return nil
	}
	generation, err := c.Snapshot()
	if err != nil {
		pl.Stop = &Stop{Err: err}
		return nil
	}
	epoch := Epoch{Snapshot: generation, Releases: planning.Releases, Members: g.Generations}
	if !g.Alone {
		// A sibling's cycle found no plan on this very snapshot, with no
		// plan dropped and no member's spec changed since: the answer is
		// the same.
		if msg, ok := planning.Reuse(epoch, g.Pending, g.Request.Needed, c.Now()); ok {
			pl.Stop = &Stop{Message: msg}
			return nil
		}
	}
	// Members still waiting at Permit from a plan that was dropped while
	// they entered it hold capacity no plan accounts for: release them first.
	released := c.ReleaseWaiting(info.Key, fmt.Sprintf("gang %s is being planned again", info.Key))
	attempt := c.TryPlan(planning)
	if attempt.Plan == nil {
		r := Refusal{Outcome: OutcomeUnschedulable, Message: attempt.Message}
		if !g.Alone {
			// A member placed alone (beyond the quorum) leads nobody.
			r.Lead = &Member{UID: pod.UID, Name: pod.Name}
		}
		// Reused only when the planner's own screening decided: what the
		// filters see (volumes, claims, pod labels) changes without the
		// snapshot's generation, and members released here change it next.
		if !g.Alone && attempt.Screened && released == 0 {
			r.Reuse = &ReusableRefusal{Epoch: epoch, Pending: g.Pending, Needed: g.Request.Needed, Valid: reuseRefusal}
		}
		d.refuse(c, pl, r, attempt.FailedPlan)
		return nil
	}
	active, effects, stop := d.InstallGathered(c, g, attempt.Plan, pod, nil, "")
	pl.Effects = append(pl.Effects, effects)
	pl.Stop, pl.Planned = stop, stop == nil
	return active
}

// InstallGathered makes plan, made for g, the gang's active plan (Install)
// and returns it; pod's cycle made it. victims are the pods it preempts,
// announced by preempting; without victims the plan is announced as planned.
// The Stop says why the plan is not active after all.
func (d Decisions) InstallGathered(c Cycle, g *Gathered, plan *Plan, pod *v1.Pod, victims []*v1.Pod, preempting string) (*ActivePlan, Effects, *Stop) {
	key := g.Info.Key
	now := c.Now()
	active := &ActivePlan{
		Plan:     *plan,
		Requests: map[types.UID]Resources{},
		Reserved: sets.New[types.UID](),
		Victims:  sets.New[types.UID](),
		Profile:  c.Profile(),
		Created:  now,
		Deadline: now.Add(g.Info.Timeout),
		Quorum:   g.Info.Quorum,
		Priority: g.Priority,
		CountsOn: sets.New(g.CountsOn...),
	}
	for _, member := range g.Request.Members {
		if _, ok := plan.Slots[member.UID]; ok {
			active.Requests[member.UID] = member.Request
		}
	}
	for _, v := range victims {
		active.Victims.Insert(v.UID)
	}
	active.Evicted = active.Victims.Clone()
	message := preempting
	if len(victims) == 0 {
		message = fmt.Sprintf("gang %s: %d members planned on %d nodes in %s %s (%d preemptible)",
			key, len(plan.Slots), plan.Nodes, plan.Level, plan.Domain, plan.PreemptibleNodes)
		if n := len(g.CountsOn); n > 0 {
			message += fmt.Sprintf(", joining %d running members", n)
		}
	}
	effects, ok := d.gangs.Install(key, active, pod.UID, message, pod.CreationTimestamp.Time, c.Presence(victims), c.BackoffBase())
	if !ok {
		return nil, effects, &Stop{Retry: true, Message: fmt.Sprintf("gang %s was planned concurrently; retrying", key)}
	}
	if d := effects.Dropped; d != nil {
		return nil, effects, &Stop{Retry: true, Message: fmt.Sprintf("gang %s: %s; the plan is dropped", key, d.Reason)}
	}
	return active, effects, nil
}

// steer sends a planned member to its slot, or holds it back while its
// plan waits for the pods it preempted.
func (d Decisions) steer(c PlacingCycle, pl *Placement, pod *v1.Pod, plan *ActivePlan) {
	pl.Plan = plan
	node, planned := plan.Slots[pod.UID]
	if !planned {
		pl.Stop = &Stop{Message: fmt.Sprintf("%s is placing %d other members; this pod waits for that plan to finish", pl.Key.Subject(), len(plan.Slots))}
		return
	}
	pl.Node = node
	if msg := VictimsAwaited(pl.Key, plan, c.VictimsLingering); msg != "" {
		pl.HeldBack = true
		pl.Stop = &Stop{Message: msg}
	}
}

// VictimsAwaited says what plan still waits for before its members may go
// to their slots ("" when nothing): pods it preempted that have not
// terminated, or, asked of lingering (PlacingCycle.VictimsLingering), one
// the scheduler's cache still shows on a planned node or the DRA devices
// they held. A member's PreFilter (steer), its PostFilter and the pod
// group's PostFilter all ask it, so they hold a member back for the same
// reasons.
func VictimsAwaited(key Key, plan *ActivePlan, lingering func(*ActivePlan) string) string {
	waitsFor := ""
	if n := plan.Victims.Len(); n > 0 {
		waitsFor = fmt.Sprintf("them; %d of them still terminating", n)
	} else if waitsFor = lingering(plan); waitsFor == "" {
		return ""
	}
	return fmt.Sprintf("%s preempted pods to make room and waits for %s", key.Subject(), waitsFor)
}

// refuse records r for the gang (Refused) and stops the cycle with its
// message; failedPlan, when set, tallies the record of a refusal that is news.
func (d Decisions) refuse(c Cycle, pl *Placement, r Refusal, failedPlan func() *FailedPlan) {
	e := d.gangs.Refused(pl.Key, r, c.Now())
	if e.Notice != nil && failedPlan != nil {
		pl.FailedPlan = failedPlan()
	}
	pl.Effects = append(pl.Effects, e)
	pl.Stop = &Stop{Message: r.Message}
}
