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
