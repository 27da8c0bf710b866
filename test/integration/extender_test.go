package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// holdLabel marks the pods whose scheduling cycle the holding extender
// holds.
const holdLabel = "muster.test/hold"

// holdingExtender is a scheduler extender (kube-scheduler's HTTP filter
// hook) that lets the first `pass` pods labelled holdLabel through and
// holds the scheduling cycle of every other such pod until released.
// Extenders run in a pod's own cycle only, after the plan was made, so a
// held member is planned but not reserved while the members let through
// wait at Permit: a member that is slow to come, on demand, whatever order
// the queue takes the members in.
type holdingExtender struct {
	url     string
	pass    int
	mu      sync.Mutex
	passed  map[string]bool
	holding map[string]bool // pods whose filter call is held now
	release chan struct{}
	once    sync.Once
}

func startHoldingExtender(t *testing.T, pass int) *holdingExtender {
	t.Helper()
	e := &holdingExtender{pass: pass, passed: map[string]bool{}, holding: map[string]bool{}, release: make(chan struct{})}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if args.Pod != nil && args.Pod.Labels[holdLabel] == "true" && !e.letThrough(args.Pod.Name) {
			e.setHolding(args.Pod.Name, true)
			defer e.setHolding(args.Pod.Name, false)
			select {
			case <-e.release:
			case <-r.Context().Done():
				return
			}
		}
		_ = json.NewEncoder(w).Encode(&extenderv1.ExtenderFilterResult{Nodes: args.Nodes})
	})}
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(func() { e.Release(); _ = server.Close() })
	e.url = "http://" + listener.Addr().String()
	return e
}

func (e *holdingExtender) letThrough(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.passed[name] && len(e.passed) < e.pass {
		e.passed[name] = true
	}
	return e.passed[name]
}

func (e *holdingExtender) setHolding(name string, on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if on {
		e.holding[name] = true
	} else {
		delete(e.holding, name)
	}
}

// membersAtPermit returns the pods let through once a held pod's cycle is
// blocked here. The scheduling loop runs one cycle at a time and Permit is
// part of the cycle, so every pod let through before it has been reserved
// and waits at Permit (or is bound): that is known without a
// nominatedNodeName, which muster's scheduler does not write.
func (e *holdingExtender) membersAtPermit() (passed []string, held bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for name := range e.passed {
		passed = append(passed, name)
	}
	return passed, len(e.holding) > 0
}

// Release lets every held cycle, and all later ones, go on.
func (e *holdingExtender) Release() { e.once.Do(func() { close(e.release) }) }

// Config is the KubeSchedulerConfiguration stanza that installs it.
func (e *holdingExtender) Config() string {
	return fmt.Sprintf("\nextenders:\n- urlPrefix: %s\n  filterVerb: filter\n  httpTimeout: 300s\n", e.url)
}

// held marks a pod to be held by the extender.
func held(p *corev1.Pod) {
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[holdLabel] = "true"
}

// waitOneAtPermit waits until one member passed the extender and waits at
// Permit while the next is held, and returns the waiting member's name.
func (c *cluster) waitOneAtPermit(ext *holdingExtender) string {
	c.t.Helper()
	var waiting string
	c.waitFor("a member waiting at Permit, the other held", 30*time.Second, func() (bool, error) {
		passed, held := ext.membersAtPermit()
		if len(passed) == 1 && held {
			waiting = passed[0]
		}
		return waiting != "", nil
	})
	return waiting
}
