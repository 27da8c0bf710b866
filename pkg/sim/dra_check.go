package sim

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/sim/measure"
)

// deviceKey names a device across pools.
func deviceKey(driver, pool, device string) string { return driver + "/" + pool + "/" + device }

// checkDRA checks, after a step settled, what DRA must hold:
//
//   - every GPU member bound in this step to a DRA node names in
//     status.extendedResourceClaimStatus a claim it owns, reserved for it,
//     allocated exactly its GPUs, all devices of that node's pool; a member
//     bound to a device-plugin node, or asking for no GPU, names none;
//   - no device is allocated to two claims;
//   - the devices allocated are exactly the GPUs the bound members on DRA
//     nodes hold: claims of pods gone were released, none is missing.
func (c *cluster) checkDRA() {
	d := c.dra
	if d == nil {
		return
	}
	records := d.checked.unread()
	d.checked.read(len(records))
	for _, r := range records {
		g := c.work.podGang[r.pod]
		spec := c.nodes.byName[r.node]
		pod, err := d.pods.Pods(namespace).Get(r.pod)
		if g == nil || spec == nil || err != nil || pod.UID != r.uid {
			continue // deleted since (evicted, restarted, its node reclaimed)
		}
		d.checkBoundPod(pod, r.node, g.podGPUs(r.pod), spec.dra)
	}

	claims, err := d.claims.ResourceClaims(namespace).List(labels.Everything())
	if err != nil {
		d.violation("listing claims: %v", err)
		return
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].Name < claims[j].Name })
	owner := map[string]string{}
	allocated := 0
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, res := range claim.Status.Allocation.Devices.Results {
			key := deviceKey(res.Driver, res.Pool, res.Device)
			if other, dup := owner[key]; dup {
				d.violation("t=%s: device %s is allocated to claims %s and %s", c.eng.now, key, other, claim.Name)
			}
			owner[key] = claim.Name
			allocated++
		}
	}
	var held int64
	for _, g := range c.work.liveGangs() {
		for pod, node := range g.bound {
			if spec := c.nodes.byName[node]; spec != nil && spec.dra {
				held += g.podGPUs(pod)
			}
		}
	}
	if int64(allocated) != held {
		d.violation("t=%s: %d devices allocated, but the GPU members bound to DRA nodes hold %d", c.eng.now, allocated, held)
	}
	d.mu.Lock()
	d.stats.PeakDevicesAllocated = max(d.stats.PeakDevicesAllocated, allocated)
	d.mu.Unlock()
}

// checkBoundPod checks one bound member's claim (checkDRA).
func (d *draCluster) checkBoundPod(pod *v1.Pod, node string, gpus int64, dra bool) {
	st := pod.Status.ExtendedResourceClaimStatus
	if gpus == 0 || !dra {
		if st != nil {
			d.violation("pod %s (%d GPUs) on node %s (DRA %t) has extended-resource claim %s", pod.Name, gpus, node, dra, st.ResourceClaimName)
		}
		return
	}
	if st == nil || st.ResourceClaimName == "" {
		d.violation("pod %s bound to DRA node %s has no status.extendedResourceClaimStatus", pod.Name, node)
		return
	}
	claim, err := d.claims.ResourceClaims(namespace).Get(st.ResourceClaimName)
	if err != nil {
		d.violation("pod %s: its claim %s: %v", pod.Name, st.ResourceClaimName, err)
		return
	}
	ownedBy := false
	for _, o := range claim.OwnerReferences {
		ownedBy = ownedBy || (o.Kind == "Pod" && o.UID == pod.UID)
	}
	reserved := false
	for _, r := range claim.Status.ReservedFor {
		reserved = reserved || r.UID == pod.UID
	}
	switch {
	case !ownedBy:
		d.violation("pod %s: claim %s is not owned by it", pod.Name, claim.Name)
	case !reserved:
		d.violation("pod %s: claim %s is not reserved for it (reservedFor %v)", pod.Name, claim.Name, claim.Status.ReservedFor)
	case claim.Status.Allocation == nil:
		d.violation("pod %s: claim %s is not allocated", pod.Name, claim.Name)
	default:
		var onNode int64
		for _, res := range claim.Status.Allocation.Devices.Results {
			if res.Driver == testobj.GPUDriver && res.Pool == node {
				onNode++
			} else {
				d.violation("pod %s on %s: claim %s has device %s", pod.Name, node, claim.Name, deviceKey(res.Driver, res.Pool, res.Device))
			}
		}
		if onNode != gpus {
			d.violation("pod %s asks for %d GPUs, its claim %s is allocated %d devices of node %s", pod.Name, gpus, claim.Name, onNode, node)
		}
	}
	d.mu.Lock()
	d.stats.ClaimsChecked++
	d.mu.Unlock()
}

// draResult is the run's DRA record (nil without DRA).
func (c *cluster) draResult() *measure.DRA {
	if c.dra == nil {
		return nil
	}
	c.dra.mu.Lock()
	defer c.dra.mu.Unlock()
	st := c.dra.stats
	st.Violations = append([]string(nil), st.Violations...)
	return &st
}
