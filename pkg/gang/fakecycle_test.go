package gang

import (
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/internal/testobj"
)

// fakeCycle answers Place and Unplaced as the scheduler would, from its
// fields, and counts what it was asked.
type fakeCycle struct {
	now      time.Time
	inGang   bool
	resolveE error
	ended    bool
	// gather refuses when set; otherwise a0 and a1 are pending.
	refusal *Refusal
	// plan is what TryPlan finds (nil: no room, screened).
	plan *Plan
	// searchErr is SearchVictims' error.
	searchErr error
	lingering string
	held      bool
	// terminating counts pods terminating for the member on its nominated
	// node; inSnapshot, refusedAt and waits answer Unplaced.
	terminating int
	inSnapshot  bool
	refusedAt   string
	avoid       bool
	waits       string
	preemption  bool
	victims     *Victims

	gathered, computed, releasedWaiting, requested int
}

var jobRef = &v1.ObjectReference{Kind: "Job", Namespace: "ns", Name: "a"}

func (c *fakeCycle) Now() time.Time             { return c.now }
func (c *fakeCycle) Profile() string            { return "muster" }
func (c *fakeCycle) BackoffBase() time.Duration { return time.Second }
func (c *fakeCycle) Ended(Key) bool             { return c.ended }
func (c *fakeCycle) PriorityOf(*v1.Pod) int32   { return 0 }
func (c *fakeCycle) RequestOf(*v1.Pod) Resources {
	c.requested++
	return Resources{MilliCPU: 500}
}
func (c *fakeCycle) Resolve(pod *v1.Pod) (*Resolved, bool, error) {
	return &Resolved{Key: jobA, Ref: jobRef, Ask: Ask{Quorum: 2, Timeout: time.Minute}}, c.inGang, c.resolveE
}
func (c *fakeCycle) Gather(pod *v1.Pod, info *Resolved, _ *Planning) (*Gathered, *Refusal) {
	c.gathered++
	if c.refusal != nil {
		return nil, c.refusal
	}
	return &Gathered{Info: info, Pending: 2, Request: Request{Needed: 2, GPU: "nvidia.com/gpu", Members: []Member{{UID: "a0"}, {UID: "a1"}}}}, nil
}
func (c *fakeCycle) Snapshot() (int64, error) { return 7, nil }
func (c *fakeCycle) ReleaseWaiting(Key, string) int {
	c.releasedWaiting++
	return 0
}
func (c *fakeCycle) TryPlan(*Planning) Attempt {
	c.computed++
	if c.plan == nil {
		return Attempt{Message: "no room", Screened: true, FailedPlan: func() *FailedPlan { return &FailedPlan{Message: "no room"} }}
	}
	return Attempt{Plan: c.plan}
}
func (c *fakeCycle) Presence([]*v1.Pod) Presence             { return nil }
func (c *fakeCycle) VictimsLingering(*ActivePlan) string     { return c.lingering }
func (c *fakeCycle) HeldOut(*v1.Pod) (bool, bool)            { return c.held, true }
func (c *fakeCycle) TerminatingFor(*v1.Pod, string) int      { return c.terminating }
func (c *fakeCycle) ReleaseEarlierAllocation(*v1.Pod) string { return "" }
func (c *fakeCycle) WaitsForVictims(Key, *ActivePlan, string) (string, bool) {
	return c.waits, c.waits != ""
}
func (c *fakeCycle) InSnapshot(string) bool                   { return c.inSnapshot }
func (c *fakeCycle) RefusedAt(*v1.Pod, string) (string, bool) { return c.refusedAt, c.avoid }
func (c *fakeCycle) Preemption() (bool, time.Duration)        { return c.preemption, time.Second }
func (c *fakeCycle) StillTerminating(Key) (int, error)        { return 0, nil }
func (c *fakeCycle) SearchVictims() (*Victims, error)         { return c.victims, c.searchErr }

// member is gang a's member uid.
func member(uid types.UID) *v1.Pod {
	pod := testobj.MakePod("ns", string(uid)).Obj()
	pod.UID = uid
	return pod
}

var twoSlots = &Plan{Slots: map[types.UID]string{"a0": "n1", "a1": "n2"}, Nodes: 2, Level: "rack", Domain: "r1"}
