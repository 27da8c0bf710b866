package tfconfig

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// optedIn reports whether the Job asks for a TF_CONFIG Secret and is not being deleted.
func optedIn(job *batchv1.Job) bool {
	return job.Labels[OptInLabel] == "true" && job.DeletionTimestamp == nil
}

// groupOf returns the Job's group name, or "" for a Job that forms a cluster on its own.
func groupOf(job *batchv1.Job) string { return job.Labels[GroupLabel] }

// roleOf returns the Job's TensorFlow role (worker when not annotated).
func roleOf(job *batchv1.Job) (Role, error) {
	v, ok := job.Annotations[RoleAnnotation]
	if !ok {
		return RoleWorker, nil
	}
	r, err := ParseRole(v)
	if err != nil {
		return "", invalidf(ReasonInvalidRole, "annotation %s: %v", RoleAnnotation, err)
	}
	return r, nil
}

// taskSetFor checks that the Job can serve as one role of a TensorFlow cluster and returns it. Errors
// are *InvalidError whose message says how to fix the Job.
func taskSetFor(job *batchv1.Job) (TaskSet, error) {
	role, err := roleOf(job)
	if err != nil {
		return TaskSet{}, err
	}
	if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion {
		return TaskSet{}, invalidf(ReasonNotIndexed, "Job is not Indexed: set spec.completionMode: Indexed so each pod gets a stable index and the hostname %s-<index>", job.Name)
	}
	// The API server defaults parallelism to 1 and requires completions for Indexed Jobs.
	parallelism, completions := int32(1), int32(-1)
	if job.Spec.Parallelism != nil {
		parallelism = *job.Spec.Parallelism
	}
	if job.Spec.Completions != nil {
		completions = *job.Spec.Completions
	}
	if parallelism != completions {
		return TaskSet{}, invalidf(ReasonParallelismMismatch, "spec.parallelism (%d) differs from spec.completions (%s): every TensorFlow task must run at once, so set both to the number of tasks (change them together to resize)", parallelism, optionalInt(job.Spec.Completions))
	}
	port, err := tfPort(&job.Spec.Template.Spec)
	if err != nil {
		return TaskSet{}, err
	}
	ts := TaskSet{
		Role:      role,
		JobName:   job.Name,
		Subdomain: job.Spec.Template.Spec.Subdomain,
		Port:      port,
		Replicas:  completions,
	}
	// The builder's checks, so that a bad Job is reported as itself and not as "the group".
	if err := validateTaskSet(ts); err != nil {
		return TaskSet{}, err
	}
	return ts, nil
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

// plan is what reconciling one Job needs: its own task set and the cluster spec of its whole group,
// or the reason it cannot be served yet.
type plan struct {
	self    TaskSet
	cluster []byte
	// problem is set when no Secret may be written; waiting tells a group still being created
	// (a Normal event) from a Job that has to be fixed (a Warning).
	problem *InvalidError
	waiting bool
	tasks   int32 // tasks listed in cluster
}

// planFor computes the plan of job, whose group (job included, deleted Jobs excluded) is members.
func planFor(job *batchv1.Job, members []*batchv1.Job) plan {
	self, err := taskSetFor(job)
	if err != nil {
		return plan{problem: asInvalid(err)}
	}
	group := groupOf(job)
	if group == "" {
		members = []*batchv1.Job{job}
	}
	members = withJob(members, job)
	sort.Slice(members, func(i, j int) bool { return members[i].Name < members[j].Name })

	sets := make([]TaskSet, 0, len(members))
	wantRoles, wantFrom := "", ""
	for _, m := range members {
		ts := self
		if m.Name != job.Name {
			if ts, err = taskSetFor(m); err != nil {
				return plan{problem: invalidf(ReasonInvalidGroup, "Job %q of group %q cannot be served (%v): fix or delete it", m.Name, group, err)}
			}
		}
		sets = append(sets, ts)
		if v, ok := m.Annotations[GroupRolesAnnotation]; ok {
			norm, err := normalizeRoles(v)
			if err != nil {
				return plan{problem: invalidf(ReasonInvalidGroup, "Job %q: annotation %s: %v", m.Name, GroupRolesAnnotation, err)}
			}
			if wantFrom != "" && norm != wantRoles {
				return plan{problem: invalidf(ReasonInvalidGroup, "Jobs %q and %q disagree on %s (%q and %q): give every Job of group %q the same value", wantFrom, m.Name, GroupRolesAnnotation, wantRoles, norm, group)}
			}
			wantRoles, wantFrom = norm, m.Name
		}
	}

	if wantFrom != "" {
		want := strings.Split(wantRoles, ",")
		have := map[Role]bool{}
		for _, s := range sets {
			have[s.Role] = true
			if !strings.Contains(","+wantRoles+",", ","+string(s.Role)+",") {
				return plan{problem: invalidf(ReasonInvalidGroup, "Job %q has role %s, which %s (%q) does not list: add the role there or move the Job out of group %q", s.JobName, s.Role, GroupRolesAnnotation, wantRoles, group)}
			}
		}
		var missing []string
		for _, r := range want {
			if !have[Role(r)] {
				missing = append(missing, r)
			}
		}
		if len(missing) > 0 {
			return plan{waiting: true, problem: invalidf(ReasonWaitingForGroup, "group %q needs roles [%s] and has no Job yet for [%s]; no Secret is written until it does", group, wantRoles, strings.Join(missing, ","))}
		}
	}

	cluster, err := BuildClusterSpec(job.Namespace, sets)
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

// withJob returns the members that are opted in and not being deleted, with job in place of any Job of
// the same name (or added), so a plan never depends on whether the cache has caught up with job.
func withJob(members []*batchv1.Job, job *batchv1.Job) []*batchv1.Job {
	out := make([]*batchv1.Job, 0, len(members)+1)
	for _, m := range members {
		if m.Name != job.Name && m.Namespace == job.Namespace && optedIn(m) && groupOf(m) == groupOf(job) {
			out = append(out, m)
		}
	}
	return append(out, job)
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
