package mustergang

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// The framework's resource accounting in gang.Resources: pkg/gang stays
// free of the framework's types.

// freeOnNode is what the node still has: allocatable minus requested (the
// scheduler cache counts bound and assumed pods).
func freeOnNode(ni fwk.NodeInfo) gang.Resources {
	alloc, used := ni.GetAllocatable(), ni.GetRequested()
	free := gang.Resources{
		MilliCPU:         alloc.GetMilliCPU() - used.GetMilliCPU(),
		Memory:           alloc.GetMemory() - used.GetMemory(),
		EphemeralStorage: alloc.GetEphemeralStorage() - used.GetEphemeralStorage(),
		Pods:             int64(alloc.GetAllowedPodNumber() - len(ni.GetPods())),
	}
	if scalars := alloc.GetScalarResources(); len(scalars) > 0 {
		free.Scalars = make(map[v1.ResourceName]int64, len(scalars))
		usedScalars := used.GetScalarResources()
		for name, q := range scalars {
			free.Scalars[name] = q - usedScalars[name]
		}
	}
	return free
}

// podRequest is what one pod needs as the framework counts it: its
// PodInfo's CalculateResource, the amount NodeInfo adds to a node's
// requested resources when the pod lands there (so a plan subtracts from
// freeOnNode exactly what binding the pod will), plus one pod slot.
func podRequest(pr fwk.PodResource) gang.Resources {
	req := gang.Resources{Pods: 1}
	if pr.Resource == nil {
		return req
	}
	req.MilliCPU = pr.Resource.GetMilliCPU()
	req.Memory = pr.Resource.GetMemory()
	req.EphemeralStorage = pr.Resource.GetEphemeralStorage()
	if scalars := pr.Resource.GetScalarResources(); len(scalars) > 0 {
		req.Scalars = make(map[v1.ResourceName]int64, len(scalars))
		for name, q := range scalars {
			req.Scalars[name] = q
		}
	}
	return req
}
