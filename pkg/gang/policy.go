package gang

import "fmt"

// Policy is a job's preemptible (spot) node policy.
type Policy string

// Policies, as written in the muster.dev/preemptible annotation.
const (
	PolicyForbid  Policy = "forbid"
	PolicyAvoid   Policy = "avoid"
	PolicyPrefer  Policy = "prefer"
	PolicyRequire Policy = "require"
)

// ParsePolicy reads the annotation value; empty means avoid.
func ParsePolicy(value string) (Policy, error) {
	switch Policy(value) {
	case "":
		return PolicyAvoid, nil
	case PolicyForbid, PolicyAvoid, PolicyPrefer, PolicyRequire:
		return Policy(value), nil
	}
	return "", fmt.Errorf("invalid %s %q: must be one of forbid, avoid, prefer, require", AnnotationPreemptible, value)
}

// Excludes reports whether the policy keeps a gang off a node that is
// preemptible (spot) or not: forbid excludes spot nodes, require excludes
// on-demand ones. Every place that filters nodes by policy asks this.
func (p Policy) Excludes(preemptible bool) bool {
	return (p == PolicyForbid && preemptible) || (p == PolicyRequire && !preemptible)
}

// KeepsOff reports whether the policy keeps pods off some nodes (forbid,
// require): only then does a filter need to know which nodes are spot.
func (p Policy) KeepsOff() bool { return p == PolicyForbid || p == PolicyRequire }

// Dislikes reports whether the policy would rather not use such a node:
// avoid dislikes spot nodes, prefer dislikes on-demand ones. Every place that
// ranks nodes by policy asks this.
func (p Policy) Dislikes(preemptible bool) bool {
	return (p == PolicyAvoid && preemptible) || (p == PolicyPrefer && !preemptible)
}
