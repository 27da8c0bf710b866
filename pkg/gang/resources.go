package gang

import (
	v1 "k8s.io/api/core/v1"
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
