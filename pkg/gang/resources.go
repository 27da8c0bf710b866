package gang

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// Resources is a vector of the quantities the planner checks per node. CPU is
// in millicores, memory and storage in bytes.
type Resources struct {
	MilliCPU         int64
	Memory           int64
	EphemeralStorage int64
	Pods             int64
	Scalars          map[v1.ResourceName]int64
}

// Fits reports whether req fits into r (r is what is free).
func (r Resources) Fits(req Resources) bool {
	if req.MilliCPU > r.MilliCPU || req.Memory > r.Memory || req.EphemeralStorage > r.EphemeralStorage || req.Pods > r.Pods {
		return false
	}
	for name, q := range req.Scalars {
		if q > 0 && q > r.Scalars[name] {
			return false
		}
	}
	return true
}

// Sub subtracts req from r in place.
func (r *Resources) Sub(req Resources) {
	r.MilliCPU -= req.MilliCPU
	r.Memory -= req.Memory
	r.EphemeralStorage -= req.EphemeralStorage
	r.Pods -= req.Pods
	if len(req.Scalars) > 0 && r.Scalars == nil {
		r.Scalars = map[v1.ResourceName]int64{}
	}
	for name, q := range req.Scalars {
		r.Scalars[name] -= q
	}
}

// Clone returns a copy that shares nothing with r.
func (r Resources) Clone() Resources {
	out := r
	if r.Scalars != nil {
		out.Scalars = make(map[v1.ResourceName]int64, len(r.Scalars))
		for k, v := range r.Scalars {
			out.Scalars[k] = v
		}
	}
	return out
}

// FreeOnNode is what the node still has: allocatable minus requested (the
// scheduler cache counts bound and assumed pods).
func FreeOnNode(ni fwk.NodeInfo) Resources {
	alloc, used := ni.GetAllocatable(), ni.GetRequested()
	free := Resources{
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

// RequestOf is what one pod needs as the framework counts it: its
// PodInfo's CalculateResource, the amount NodeInfo adds to a node's
// requested resources when the pod lands there (so a plan subtracts from
// FreeOnNode exactly what binding the pod will), plus one pod slot.
func RequestOf(pr fwk.PodResource) Resources {
	req := Resources{Pods: 1}
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

// Add adds req to r in place.
func (r *Resources) Add(req Resources) {
	r.MilliCPU += req.MilliCPU
	r.Memory += req.Memory
	r.EphemeralStorage += req.EphemeralStorage
	r.Pods += req.Pods
	if len(req.Scalars) > 0 && r.Scalars == nil {
		r.Scalars = map[v1.ResourceName]int64{}
	}
	for name, q := range req.Scalars {
		r.Scalars[name] += q
	}
}
