package mustergang

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
)

// What a plan's dry run asks the framework, and what muster screens itself.
//
// The dry run runs the profile's PreFilter plugins once per member, and the
// member's own cycle runs them again. Two of them cost more than the rest
// of the plan together: InterPodAffinity's PreFilter matches the member's
// terms against every pod of the cluster, and DynamicResources' builds an
// allocator over every ResourceSlice. Both answer questions muster can
// answer exactly, per candidate node, from what it already has:
//
//   - required pod anti-affinity on kubernetes.io/hostname (terms without a
//     namespace selector): a node is refused when a pod on it, a member
//     placed there earlier in the trial or a pod nominated there matches a
//     term, as InterPodAffinity's Filter decides such terms with its
//     hostname fast path (one node is one domain);
//   - devices from dynamic resource allocation: the member's ResourceClaims
//     and its extended resources a DeviceClass serves are allocated by
//     draFits with the plugin's own allocator on the node's slices; on a
//     node that serves such a resource by device plugin, allocatable minus
//     requested decides, as NodeResourcesFit does.
//
// So the dry run shows the framework the member without those (dryRunPod):
// the other terms, requests and claims stay, and every other plugin runs.
// What the screens cannot answer, the framework keeps: terms with a
// namespace selector or another topology key, a claim that is in use, in
// flight or not created yet, a claim of the extended resources left from
// an earlier cycle. The member's own cycle runs every plugin on its planned
// node; a refusal there breaks the plan, avoids the pair and is counted
// (muster_gang_plans_broken_total).
type dryRunMember struct {
	// pod is what RunPreFilterPlugins and the Filter plugins see.
	pod *v1.Pod
	// hostAntiAffinity are the required anti-affinity terms on the node
	// that the screen checks.
	hostAntiAffinity []fwk.AffinityTerm
	// devicePlugin are the extended resources taken out of pod that a
	// DeviceClass serves, by amount: on a node whose allocatable has one,
	// the screen checks it; elsewhere draFits allocates it.
	devicePlugin map[v1.ResourceName]int64
}

// dryRunMember is member as the dry run shows it to the framework.
func (c *filterCheck) dryRunMember(member *framework.PodInfo) dryRunMember {
	pod := member.Pod
	m := dryRunMember{pod: pod}
	kept, screened := splitHostAntiAffinity(pod)
	if len(screened) > 0 {
		terms, err := fwk.GetAffinityTerms(pod, screened)
		if err == nil { // a selector that does not parse: the plugin says so
			m.hostAntiAffinity = terms
			m.pod = withAntiAffinity(pod, kept)
		}
	}
	if c.draGPUs.screensDevices(pod) {
		extended := c.draGPUs.draExtended(member.CalculateResource().Resource.GetScalarResources())
		m.pod = withoutDevices(m.pod, extended)
		if len(extended) > 0 {
			m.devicePlugin = extended
		}
	}
	return m
}

// splitHostAntiAffinity parts pod's required anti-affinity terms into those
// the framework keeps and those the screen checks.
func splitHostAntiAffinity(pod *v1.Pod) (kept, screened []v1.PodAffinityTerm) {
	if pod.Spec.Affinity == nil || pod.Spec.Affinity.PodAntiAffinity == nil {
		return nil, nil
	}
	for _, t := range pod.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if t.TopologyKey == v1.LabelHostname && t.NamespaceSelector == nil {
			screened = append(screened, t)
		} else {
			kept = append(kept, t)
		}
	}
	return kept, screened
}

// withAntiAffinity is a copy of pod whose required anti-affinity terms are
// terms.
func withAntiAffinity(pod *v1.Pod, terms []v1.PodAffinityTerm) *v1.Pod {
	out := *pod
	affinity := *pod.Spec.Affinity
	anti := *affinity.PodAntiAffinity
	anti.RequiredDuringSchedulingIgnoredDuringExecution = terms
	affinity.PodAntiAffinity = &anti
	out.Spec.Affinity = &affinity
	return &out
}

// screensDevices reports whether draFits answers for every device pod
// needs: DRA is on and each of its claims exists and is either free to
// allocate or allocated where pod may use it. A claim in use by others, in
// flight or not created yet, or an extended-resource claim from an earlier
// cycle, is the DynamicResources plugin's to explain.
func (d *draGPUs) screensDevices(pod *v1.Pod) bool {
	if !d.enabled() || pod.Status.ExtendedResourceClaimStatus != nil {
		return false
	}
	claims := d.podClaims(pod)
	if len(claims) != len(pod.Spec.ResourceClaims) {
		return false
	}
	for _, claim := range claims {
		if claim.Status.Allocation != nil {
			if !resourceclaim.CanBeReserved(claim) && !resourceclaim.IsReservedForPod(pod, claim, true) {
				return false
			}
		} else if d.manager.ResourceClaims().GetPendingAllocation(claim.UID) != nil {
			return false
		}
	}
	return true
}

// draExtended are the extended resources of requested that a DeviceClass
// serves.
func (d *draGPUs) draExtended(requested map[v1.ResourceName]int64) map[v1.ResourceName]int64 {
	var out map[v1.ResourceName]int64
	for name, q := range requested {
		if q <= 0 || !schedutil.IsDRAExtendedResourceName(name) || d.manager.DeviceClassResolver().GetDeviceClass(name) == nil {
			continue
		}
		if out == nil {
			out = map[v1.ResourceName]int64{}
		}
		out[name] = q
	}
	return out
}

// withoutDevices is a copy of pod without ResourceClaims and without the
// extended resources named in extended, in every container and the pod's
// own resources. pod itself is unchanged.
func withoutDevices(pod *v1.Pod, extended map[v1.ResourceName]int64) *v1.Pod {
	if len(pod.Spec.ResourceClaims) == 0 && len(extended) == 0 {
		return pod
	}
	out := *pod
	out.Spec.ResourceClaims = nil
	strip := func(cs []v1.Container) []v1.Container {
		if cs == nil {
			return nil
		}
		cs = append([]v1.Container(nil), cs...)
		for i := range cs {
			cs[i].Resources = withoutResources(cs[i].Resources, extended)
		}
		return cs
	}
	out.Spec.Containers = strip(pod.Spec.Containers)
	out.Spec.InitContainers = strip(pod.Spec.InitContainers)
	if pod.Spec.Resources != nil {
		r := withoutResources(*pod.Spec.Resources, extended)
		out.Spec.Resources = &r
	}
	return &out
}

func withoutResources(r v1.ResourceRequirements, extended map[v1.ResourceName]int64) v1.ResourceRequirements {
	r.Claims = nil
	drop := func(l v1.ResourceList) v1.ResourceList {
		if l == nil {
			return nil
		}
		out := make(v1.ResourceList, len(l))
		for name, q := range l {
			if _, gone := extended[name]; !gone {
				out[name] = q
			}
		}
		return out
	}
	r.Requests, r.Limits = drop(r.Requests), drop(r.Limits)
	return r
}

// screen checks what the framework was not shown of m on ni, with the pods
// nominated there; "" when it fits, else why not and in whose name.
func (m *dryRunMember) screen(ni fwk.NodeInfo, nominated []fwk.PodInfo) (why, plugin string) {
	if len(m.hostAntiAffinity) > 0 {
		if _, named := ni.Node().Labels[v1.LabelHostname]; named && (antiAffinityMatch(m.hostAntiAffinity, ni.GetPods()) || antiAffinityMatch(m.hostAntiAffinity, nominated)) {
			return "node(s) didn't match pod anti-affinity rules", "InterPodAffinity"
		}
	}
	if len(m.devicePlugin) > 0 {
		allocatable, requested := ni.GetAllocatable().GetScalarResources(), ni.GetRequested().GetScalarResources()
		for name, q := range m.devicePlugin {
			if allocatable[name] == 0 {
				continue // served by DRA here: draFits allocates it
			}
			used := requested[name]
			for _, pi := range nominated {
				used += pi.CalculateResource().Resource.GetScalarResources()[name]
			}
			if allocatable[name]-used < q {
				return "Insufficient " + string(name), "NodeResourcesFit"
			}
		}
	}
	return "", ""
}

func antiAffinityMatch(terms []fwk.AffinityTerm, pods []fwk.PodInfo) bool {
	for _, pi := range pods {
		for _, t := range terms {
			if t.Matches(pi.GetPod(), nil) {
				return true
			}
		}
	}
	return false
}
