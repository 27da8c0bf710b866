package mustergang

import (
	"fmt"

	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

const stateKey fwk.StateKey = "PreFilter" + Name

// cycleState is written once by PreFilter and only read afterwards, so Clone
// may share it.
type cycleState struct {
	// slot is the member's planned node; empty for pods scheduled alone.
	slot   string
	planID int64
	key    gang.Key
	policy gang.Policy
	// held and request let Filter keep pods scheduled alone off capacity
	// that gang plans hold.
	held    map[string][]gang.Holding
	request gang.Resources
	// dra is the nodes' free DRA GPUs when held capacity is checked.
	dra *draState
	// heldForVictims: PreFilter held the planned member back until the pods
	// its plan preempted are gone.
	heldForVictims bool
	// pass is the pod-group cycle's tentative pass the member was steered
	// in, if it was (workloadgroup.go).
	pass *groupPass
}

func (s *cycleState) Clone() fwk.StateData { return s }

// readState returns what PreFilter wrote. A missing state where PreFilter
// must have run is a bug, reported rather than guessed around: a gang
// member without its state must never be taken for a pod scheduled alone.
func readState(cs fwk.CycleState) (*cycleState, error) {
	data, err := cs.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("%s: reading PreFilter state: %w", Name, err)
	}
	s, ok := data.(*cycleState)
	if !ok {
		return nil, fmt.Errorf("%s: PreFilter state has type %T", Name, data)
	}
	return s, nil
}
