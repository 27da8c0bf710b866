package gang

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// BenchmarkAdmit is the manager's part of a gang member's PreFilter while
// other gangs hold plans of 8 unreserved members each: Admit alone (what a
// member pays when a sibling's refusal is reused) and Admit followed by
// what planning reads of the other gangs' holdings (what every Admit paid
// when it summed them itself).
func BenchmarkAdmit(b *testing.B) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	key := Key{Kind: KindJob, Namespace: "ns", Name: "waiting"}
	for _, plans := range []int{10, 1000} {
		m := NewManager()
		installPlansOf8(b, m, plans, now)
		b.Run(fmt.Sprintf("plans=%d/reuse", plans), func(b *testing.B) {
			for b.Loop() {
				if a := m.Admit(key, now, now); a.Planning == nil {
					b.Fatal("no planning")
				}
			}
		})
		b.Run(fmt.Sprintf("plans=%d/plan", plans), func(b *testing.B) {
			for b.Loop() {
				if a := m.Admit(key, now, now); len(a.Planning.HeldByOthers()) != plans {
					b.Fatal("holdings not read")
				}
			}
		})
	}
}

// BenchmarkLookupsAmongBoundGangs is what a pod scheduled alone (Held), a
// failed cycle (PlanOf) and a dropped plan ask of the manager on a cluster
// where most gangs the scheduler knows run bound and only a few hold plans:
// 2000 bound gangs and 10 plans of 8 members.
func BenchmarkLookupsAmongBoundGangs(b *testing.B) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	m := NewManager()
	for g := range 2000 {
		m.MemberBound(Key{Kind: KindJob, Namespace: "ns", Name: fmt.Sprintf("bound%d", g)}, types.UID(fmt.Sprintf("bound%d-0", g)), now)
	}
	installPlansOf8(b, m, 10, now)
	b.Run("Held", func(b *testing.B) {
		for b.Loop() {
			if len(m.Held(AnyPriority)) != 10 {
				b.Fatal("holdings not read")
			}
		}
	})
	// A plan installed and dropped: the drop wakes the gangs that found no
	// room (10 of them here).
	for g := range 10 {
		m.Refused(Key{Kind: KindJob, Namespace: "ns", Name: fmt.Sprintf("waiting%d", g)}, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, now)
	}
	churn := Key{Kind: KindJob, Namespace: "ns", Name: "churn"}
	b.Run("InstallDrop", func(b *testing.B) {
		for b.Loop() {
			plan := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{"c0": "n0"}}, Reserved: sets.New[types.UID](), Created: now, Deadline: now.Add(time.Minute)}
			if _, ok := m.Install(churn, plan, "", "planned", now, nil, 0); !ok {
				b.Fatal("Install refused")
			}
			if e := m.Drop(churn, 0, DropNodeChanged, "churn", now, 0); len(e.Wake) != 10 {
				b.Fatalf("woke %d gangs, want 10", len(e.Wake))
			}
		}
	})
	b.Run("PlanOf", func(b *testing.B) {
		for b.Loop() {
			if _, plan := m.PlanOf("not-planned"); plan != nil {
				b.Fatal("a plan for a pod in none")
			}
		}
	})
}

// installPlansOf8 installs plans for gangs g0..g<n-1>, each of 8 unreserved
// 1-GPU members on node n<g>.
func installPlansOf8(b *testing.B, m *Manager, n int, now time.Time) {
	b.Helper()
	for g := range n {
		plan := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{}}, Requests: map[types.UID]Resources{},
			Reserved: sets.New[types.UID](), Created: now, Deadline: now.Add(time.Minute)}
		for i := range 8 {
			uid := types.UID(fmt.Sprintf("g%d-%d", g, i))
			plan.Slots[uid] = fmt.Sprintf("n%d", g)
			plan.Requests[uid] = Resources{MilliCPU: 1000, Scalars: map[v1.ResourceName]int64{"nvidia.com/gpu": 1}}
		}
		if _, ok := m.Install(Key{Kind: KindJob, Namespace: "ns", Name: fmt.Sprintf("g%d", g)}, plan, "", "planned", now, nil, 0); !ok {
			b.Fatal("Install refused")
		}
	}
}
