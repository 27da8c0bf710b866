package tfconfig

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// optedIn reports whether the workload asks for a TF_CONFIG Secret and is not being deleted.
func optedIn(w metav1.Object) bool {
	return w.GetLabels()[OptInLabel] == "true" && w.GetDeletionTimestamp() == nil
}

// groupOf returns the workload's group name, or "" for one that forms a cluster on its own.
func groupOf(w metav1.Object) string { return w.GetLabels()[GroupLabel] }

// roleOf returns the workload's TensorFlow role (worker when not annotated).
func roleOf(w metav1.Object) (Role, error) {
	v, ok := w.GetAnnotations()[RoleAnnotation]
	if !ok {
		return RoleWorker, nil
	}
	r, err := ParseRole(v)
	if err != nil {
		return "", invalidf(ReasonInvalidRole, "annotation %s: %v", RoleAnnotation, err)
	}
	return r, nil
}

func optionalInt(p *int32) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// tfPort returns the number of the container port named tfjob-port, or DefaultPort when there is none.
func tfPort(spec *corev1.PodSpec) (int32, error) {
	found := int32(0)
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name != PortName {
				continue
			}
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				return 0, invalidf(ReasonInvalidPort, "container %q: port %s uses %s, but TensorFlow's gRPC needs TCP: remove the protocol or set it to TCP", c.Name, PortName, p.Protocol)
			}
			if p.ContainerPort < 1 || p.ContainerPort > 65535 {
				return 0, invalidf(ReasonInvalidPort, "container %q: port %s is %d: use a number from 1 to 65535", c.Name, PortName, p.ContainerPort)
			}
			if found != 0 && found != p.ContainerPort {
				return 0, invalidf(ReasonInvalidPort, "two containers declare a port named %s (%d and %d): declare it once, on the container that runs TensorFlow", PortName, found, p.ContainerPort)
			}
			found = p.ContainerPort
		}
	}
	if found == 0 {
		return DefaultPort, nil
	}
	return found, nil
}

// plan is what reconciling one workload needs: its own task set and the cluster spec of its whole
// group, or the reason it cannot be served yet.
type plan struct {
	self    TaskSet
	cluster []byte
	// problem is set when no Secret may be written; waiting tells a state that will pass (a group
	// still being created, a StatefulSet scaled to zero: a Normal event) from a workload that has to be
	// fixed (a Warning).
	problem *InvalidError
	waiting bool
	tasks   int32 // tasks listed in cluster
}

// planFor computes the plan of w, whose group (w included or not, deleted members excluded) is members.
func planFor(w workload, members []workload) plan {
	self, err := w.taskSet()
	if err != nil {
		ie := asInvalid(err)
		return plan{problem: ie, waiting: ie.Reason == ReasonScaledToZero}
	}
	group := groupOf(w)
	if group == "" {
		members = nil
	}
	members = withSelf(members, w)
	sort.Slice(members, func(i, j int) bool {
		if members[i].GetName() != members[j].GetName() {
			return members[i].GetName() < members[j].GetName()
		}
		return members[i].kind() < members[j].kind()
	})

	sets := make([]TaskSet, 0, len(members))
	wantRoles, wantFrom := "", ""
	for _, m := range members {
		ts := self
		if keyOf(m) != keyOf(w) {
			if ts, err = m.taskSet(); err != nil {
				return plan{problem: invalidf(ReasonInvalidGroup, "%s %q of group %q cannot be served (%v): fix or delete it", m.kind(), m.GetName(), group, err)}
			}
		}
		sets = append(sets, ts)
		if v, ok := m.GetAnnotations()[GroupRolesAnnotation]; ok {
			norm, err := normalizeRoles(v)
			if err != nil {
				return plan{problem: invalidf(ReasonInvalidGroup, "%s %q: annotation %s: %v", m.kind(), m.GetName(), GroupRolesAnnotation, err)}
			}
			if wantFrom != "" && norm != wantRoles {
				return plan{problem: invalidf(ReasonInvalidGroup, "%s and %s %q disagree on %s (%q and %q): give every member of group %q the same value", wantFrom, m.kind(), m.GetName(), GroupRolesAnnotation, wantRoles, norm, group)}
			}
			wantRoles, wantFrom = norm, fmt.Sprintf("%s %q", m.kind(), m.GetName())
		}
	}

	if wantFrom != "" {
		want := strings.Split(wantRoles, ",")
		have := map[Role]bool{}
		for _, s := range sets {
			have[s.Role] = true
			if !strings.Contains(","+wantRoles+",", ","+string(s.Role)+",") {
				return plan{problem: invalidf(ReasonInvalidGroup, "%s has role %s, which %s (%q) does not list: add the role there or move it out of group %q", s.owner(), s.Role, GroupRolesAnnotation, wantRoles, group)}
			}
		}
		var missing []string
		for _, r := range want {
			if !have[Role(r)] {
				missing = append(missing, r)
			}
		}
		if len(missing) > 0 {
			return plan{waiting: true, problem: invalidf(ReasonWaitingForGroup, "group %q needs roles [%s] and has no Job or StatefulSet yet for [%s]; no Secret is written until it does", group, wantRoles, strings.Join(missing, ","))}
		}
	}

	cluster, err := BuildClusterSpec(w.GetNamespace(), sets)
	if err != nil {
		return plan{problem: asInvalid(err)}
	}
	var tasks int32
	for _, s := range sets {
		if s.Role.inCluster() {
			tasks += s.Replicas
		}
	}
	return plan{self: self, cluster: cluster, tasks: tasks}
}

// withSelf returns the members that are opted in, in w's group and not w, plus w itself, so a plan
// never depends on whether the cache has caught up with w.
func withSelf(members []workload, w workload) []workload {
	out := make([]workload, 0, len(members)+1)
	for _, m := range members {
		if keyOf(m) != keyOf(w) && m.GetNamespace() == w.GetNamespace() && optedIn(m) && groupOf(m) == groupOf(w) {
			out = append(out, m)
		}
	}
	return append(out, w)
}

// normalizeRoles parses a comma-separated role list into a sorted, de-duplicated one.
func normalizeRoles(v string) (string, error) {
	seen := map[string]bool{}
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if _, err := ParseRole(f); err != nil {
			return "", err
		}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return "", fmt.Errorf("no roles listed")
	}
	sort.Strings(out)
	return strings.Join(out, ","), nil
}

func asInvalid(err error) *InvalidError {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return ie
	}
	return &InvalidError{Reason: ReasonInvalidGroup, Message: err.Error()}
}
