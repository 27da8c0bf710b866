package gang

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

func TestManagerLedgerAndLifecycle(t *testing.T) {
	r := NewManager()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	a := Key{Kind: KindJob, Namespace: "ns", Name: "a"}
	b := Key{Kind: KindJob, Namespace: "ns", Name: "b"}
	plan := &ActivePlan{
		Plan:     Plan{Slots: map[types.UID]string{"a0": "n1", "a1": "n2"}},
		Requests: map[types.UID]Resources{"a0": {MilliCPU: 1000}, "a1": {MilliCPU: 2000}},
		Reserved: sets.New[types.UID](),
		Deadline: now.Add(time.Minute),
	}
	if _, ok := r.Install(a, plan, "a0", "planned", now, nil, 0); !ok {
		t.Fatal("Install refused the first plan")
	}
	if _, ok := r.Install(a, &ActivePlan{Reserved: sets.New[types.UID]()}, "", "again", now, nil, 0); ok {
		t.Error("a second plan replaced the active one")
	}
	// Other gangs see what a's plan holds; a itself does not.
	if held := r.HeldForOthers(b, AnyPriority); held["n1"].MilliCPU != 1000 || held["n2"].MilliCPU != 2000 {
		t.Errorf("held for others = %v", held)
	}
	if held := r.HeldForOthers(a, AnyPriority); len(held) != 0 {
		t.Errorf("a's own plan is subtracted from a: %v", held)
	}
	if key, p := r.PlanOf("a1"); key != a || p == nil {
		t.Errorf("PlanOf(a1) = %v, %v", key, p)
	}
	// A reserved member is counted by the scheduler cache, not the ledger.
	if outcome, _, _ := r.Arrive(a, plan.ID, "a0", now, time.Second, nil); outcome != ArrivalWait {
		t.Errorf("Permit of the first member = %v, want wait", outcome)
	}
	if held := r.HeldForOthers(b, AnyPriority); held["n1"].MilliCPU != 0 || held["n2"].MilliCPU != 2000 {
		t.Errorf("held after a0 reserved = %v", held)
	}
	if outcome, _, _ := r.Arrive(a, plan.ID, "a1", now, time.Second, nil); outcome != ArrivalComplete {
		t.Errorf("Permit of the last member = %v, want complete", outcome)
	}
	if len(r.HeldForOthers(b, AnyPriority)) != 0 || r.Plan(a) != nil {
		t.Error("a completed plan still holds capacity")
	}
	// Allowed members are in flight on their nodes until seen bound.
	if got := r.InFlight(a); got["a0"] != "n1" || got["a1"] != "n2" {
		t.Errorf("in flight = %v", got)
	}
	r.MemberBound(a, "a0", now)
	if got := r.InFlight(a); len(got) != 1 {
		t.Errorf("in flight after a0 settled = %v", got)
	}

	// A failed plan backs off, doubling.
	for i, want := range []time.Duration{5 * time.Second, 10 * time.Second} {
		p := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{"b0": "n1"}}, Reserved: sets.New[types.UID]()}
		r.Install(b, p, "", "planned", now, nil, 0)
		if e := r.Drop(b, p.ID, DropRejected, "broken", now, 5*time.Second); e.Dropped == nil || e.Dropped.Backoff != want {
			t.Errorf("failure %d: dropped %+v, want backoff %v", i+1, e.Dropped, want)
		}
	}
	if e := r.Drop(b, 0, DropRejected, "again", now, time.Second); e.Dropped != nil {
		t.Error("Drop dropped a plan that no longer exists")
	}

	// Avoided pairs expire.
	avoidFor(r, b, "n1", now, now.Add(time.Minute), "b0")
	if got := r.Avoided(b, now); !got["b0"]["n1"] {
		t.Errorf("avoided = %v, want b0 on n1", got)
	}
	if got := r.Avoided(b, now.Add(time.Minute)); len(got) != 0 {
		t.Errorf("avoided after expiry = %v", got)
	}

	// Succeeded members are counted once.
	if !r.Succeed(a, "a0") || r.Succeed(a, "a0") || r.Succeeded(a) != 1 {
		t.Errorf("succeeded = %d", r.Succeeded(a))
	}
	// A gang forgotten (its object gone) counts no success read later.
	r.Forget(a, now)
	if r.Succeed(a, "a1") || r.Succeeded(a) != 0 {
		t.Errorf("a forgotten gang counted a success: %d", r.Succeeded(a))
	}
}

func TestFailedPlanIsReusedOnlyWhileNothingChanged(t *testing.T) {
	r := NewManager()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	key := Key{Kind: KindJob, Namespace: "ns", Name: "a"}
	epoch := Epoch{Snapshot: 7, Releases: releases(r, key)}
	r.Refused(key, Refusal{Outcome: OutcomeUnschedulable, Message: "no room", Reuse: &ReusableRefusal{Epoch: epoch, Pending: 4, Needed: 4, Valid: 2 * time.Second}}, now)
	if msg, ok := failedPlan(r, key, epoch, 4, 4, now.Add(time.Second)); !ok || msg != "no room" {
		t.Errorf("sibling did not reuse the failed plan: %q, %v", msg, ok)
	}
	for _, tc := range []struct {
		name            string
		epoch           Epoch
		pending, needed int
		at              time.Time
	}{
		{"snapshot changed", Epoch{Snapshot: 8}, 4, 4, now},
		{"a member's spec changed", Epoch{Snapshot: 7, Releases: epoch.Releases, Members: 1}, 4, 4, now},
		{"another pending member", epoch, 5, 4, now},
		{"quorum changed", epoch, 4, 3, now},
		{"too old", epoch, 4, 4, now.Add(2 * time.Second)},
	} {
		if _, ok := failedPlan(r, key, tc.epoch, tc.pending, tc.needed, tc.at); ok {
			t.Errorf("%s: the failed plan was reused", tc.name)
		}
	}
	// A dropped plan frees capacity the snapshot does not show.
	p := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{"b0": "n1"}}, Reserved: sets.New[types.UID]()}
	other := Key{Kind: KindJob, Namespace: "ns", Name: "b"}
	r.Install(other, p, "", "planned", now, nil, 0)
	r.Drop(other, p.ID, DropRejected, "broken", now, time.Second)
	if _, ok := failedPlan(r, key, Epoch{Snapshot: 7, Releases: releases(r, key)}, 4, 4, now); ok {
		t.Error("the failed plan was reused after another plan released its capacity")
	}
}

// TestFailedPlanFreesItsVictims: a victim that a dropped plan still waited
// for (its deletion failed, say) may be chosen by a later preemption.
func TestFailedPlanFreesItsVictims(t *testing.T) {
	r := NewManager()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	a := Key{Kind: KindJob, Namespace: "ns", Name: "a"}
	plan := &ActivePlan{
		Plan:     Plan{Slots: map[types.UID]string{"a0": "n1"}},
		Reserved: sets.New[types.UID](),
		Victims:  sets.New[types.UID]("v1", "v2"),
		Deadline: now.Add(time.Minute),
	}
	if _, ok := r.Install(a, plan, "", "preempting", now, nil, 0); !ok {
		t.Fatal("Install refused the plan")
	}
	if !r.IsVictim("v1") || !r.IsVictim("v2") {
		t.Fatal("victims not recorded")
	}
	if got := r.PlansOn("n1"); len(got) != 1 || got[0].Key != a || len(got[0].Members) != 1 {
		t.Errorf("PlansOn(n1) = %+v, want a's plan with a0", got)
	}
	if e := r.Drop(a, plan.ID, DropTimeout, "timeout", now, time.Second); e.Dropped == nil {
		t.Fatal("Drop dropped nothing")
	}
	if r.IsVictim("v1") || r.IsVictim("v2") {
		t.Error("victims of a dropped plan stay protected from later preemption")
	}
	if got := r.PlansOn("n1"); len(got) != 0 {
		t.Errorf("PlansOn(n1) after the drop = %+v", got)
	}
}

// avoidFor keeps members uids of key off node until until, as a refused
// member's transition does.
func avoidFor(m *Manager, key Key, node string, now, until time.Time, uids ...types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.avoid(m.get(key, now), key, node, now, until, uids...)
}

// failedPlan is the failed plan key's next member reuses at at, as its
// admission gives it.
func failedPlan(m *Manager, key Key, epoch Epoch, pending, needed int, at time.Time) (string, bool) {
	return m.Admit(key, at, at).Planning.Reuse(epoch, pending, needed, at)
}

// releases is the number of dropped plans key's next member plans after.
func releases(m *Manager, key Key) uint64 {
	return m.Admit(key, time.Time{}, time.Time{}).Planning.Releases
}

// The lookups by member, node and holdings see exactly the active plans:
// from Install until the plan completes, is dropped or its gang forgotten.
func TestLookupsSeeOnlyActivePlans(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	job := func(name string) Key { return Key{Kind: KindJob, Namespace: "ns", Name: name} }
	plan := func(member, node string) *ActivePlan {
		return &ActivePlan{Plan: Plan{Slots: map[types.UID]string{types.UID(member): node}},
			Requests: map[types.UID]Resources{types.UID(member): {MilliCPU: 1000}},
			Reserved: sets.New[types.UID](), Created: now, Deadline: now.Add(time.Minute)}
	}
	m := NewManager()
	active := func(t *testing.T, want ...string) {
		t.Helper()
		held := m.Held(AnyPriority)
		for _, name := range []string{"a", "b", "c"} {
			member, node := types.UID(name+"0"), "n-"+name
			_, p := m.PlanOf(member)
			on := m.PlansOn(node)
			_, holds := held[node]
			isActive := slices.Contains(want, name)
			assert.Equal(t, isActive, p != nil, "PlanOf(%s)", member)
			assert.Equal(t, isActive, len(on) == 1, "PlansOn(%s)", node)
			assert.Equal(t, isActive, holds, "Held on %s", node)
		}
	}
	for _, name := range []string{"a", "b", "c"} {
		_, ok := m.Install(job(name), plan(name+"0", "n-"+name), "", "planned", now, nil, 0)
		require.True(t, ok)
	}
	active(t, "a", "b", "c")
	m.Drop(job("a"), 0, DropRejected, "rejected", now, time.Second)
	active(t, "b", "c")
	arrival, _, _ := m.Arrive(job("b"), m.Plan(job("b")).ID, "b0", now, time.Second, nil)
	require.Equal(t, ArrivalComplete, arrival)
	active(t, "c")
	m.Forget(job("c"), now)
	active(t)
	_, ok := m.Install(job("a"), plan("a0", "n-a"), "", "planned again", now, nil, 0)
	require.True(t, ok)
	active(t, "a")
}

// Gangs that come and go leave nothing behind in the manager: a gang bound
// after preempting, one whose plan was dropped and then found no room, and
// one forgotten with its plan still waiting for victims are each dropped
// from every structure once Forget is told their pods are gone.
func TestManagerForgetsEveryKeyedEntry(t *testing.T) {
	m := NewManager()
	var keys []Key
	for i := range 99 {
		key := Key{Kind: KindJob, Namespace: "ns", Name: fmt.Sprintf("g%d", i)}
		keys = append(keys, key)
		m0, m1, victim := types.UID(fmt.Sprintf("g%d-0", i)), types.UID(fmt.Sprintf("g%d-1", i)), types.UID(fmt.Sprintf("v%d", i))
		plan := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{m0: "n1", m1: "n2"}}, Reserved: sets.New[types.UID](),
			Victims: sets.New(victim), Evicted: sets.New(victim), Profile: "muster", Created: t0, Deadline: t0.Add(time.Minute)}
		_, ok := m.Install(key, plan, m0, "preempting", t0, nil, 0)
		require.True(t, ok)
		avoidFor(m, key, "n3", t0, t0.Add(time.Hour), m0)
		switch i % 3 {
		case 0:
			m.VictimGone(victim, "muster")
			m.Arrive(key, plan.ID, m0, t0, time.Second, nil)
			arrival, _, _ := m.Arrive(key, plan.ID, m1, t0, time.Second, nil)
			require.Equal(t, ArrivalComplete, arrival)
			m.MemberBound(key, m0, t0)
			m.Succeed(key, m1)
		case 1:
			m.Drop(key, plan.ID, DropRejected, "rejected", t0, time.Second)
			m.Refused(key, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
		}
	}
	before := m.Sizes()
	for _, name := range []string{"gangs", "gangs planned", "gangs unplaceable", "victims awaited", "members in flight",
		"members succeeded", "gangs' preempted pods", "avoided (member, node) pairs"} {
		assert.Positive(t, before[name], "%s before the gangs left: the test drives no key into it", name)
	}
	for _, key := range keys {
		m.Forget(key, t0)
	}
	for name, n := range m.Sizes() {
		assert.Zero(t, n, "%s after every gang left", name)
	}
}
