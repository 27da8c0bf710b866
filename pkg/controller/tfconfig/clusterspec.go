package tfconfig

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/muster-sched/muster/pkg/gang"
)

// Role is a TensorFlow task type, the key of a job in TF_CONFIG's cluster.
type Role string

// The task types TensorFlow accepts (multi_worker_util._validate_cluster_spec). The legacy "master" is not one.
const (
	RoleChief     Role = "chief"
	RoleWorker    Role = "worker"
	RolePS        Role = "ps"
	RoleEvaluator Role = "evaluator"
)

// Roles lists the valid roles in the order the cluster spec writes them (alphabetical, like encoding/json).
var Roles = []Role{RoleChief, RoleEvaluator, RolePS, RoleWorker}

// ParseRole returns the role named s, or an error listing the valid ones.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", invalidf(ReasonInvalidRole, "%q is not a TensorFlow task type: use one of chief, worker, ps, evaluator", s)
}

// inCluster reports whether tasks of this role are listed in the cluster spec. The evaluator is not: it
// runs no gRPC server the others talk to, and MultiWorkerMirroredStrategy's health check would abort
// collectives if a listed peer never answered.
func (r Role) inCluster() bool { return r != RoleEvaluator }

// TaskSet is one role of a TensorFlow cluster, served by one Indexed Job or StatefulSet: its pods have
// hostnames <JobName>-0 … <JobName>-<Replicas-1> and the addresses
// <hostname>.<Subdomain>.<namespace>.svc:<Port>.
type TaskSet struct {
	// Kind is the kind of the workload, "Job" (also when empty) or "StatefulSet"; it only changes
	// how messages name the fields to fix.
	Kind      string
	Role      Role
	JobName   string // the Job's or StatefulSet's name
	Subdomain string // the Job's pod template subdomain or the StatefulSet's serviceName; unused for the evaluator
	Port      int32  // unused for the evaluator
	Replicas  int32
}

func (s TaskSet) isStatefulSet() bool { return s.Kind == string(gang.KindStatefulSet) }

// owner names the workload in messages.
func (s TaskSet) owner() string {
	if s.isStatefulSet() {
		return fmt.Sprintf("StatefulSet %q", s.JobName)
	}
	return fmt.Sprintf("Job %q", s.JobName)
}

// sizeFields names the fields that set the number of tasks.
func (s TaskSet) sizeFields() string {
	if s.isStatefulSet() {
		return "spec.replicas"
	}
	return "spec.parallelism and spec.completions"
}

// MaxClusterSpecBytes bounds the cluster spec. The kubelet passes TF_CONFIG (the spec plus ~60 bytes of
// task) as one environment string, and Linux refuses any single string over 128 KiB (MAX_ARG_STRLEN), so
// a larger spec would fail every container start. At ~40 bytes an address this is about 3,000 tasks.
const MaxClusterSpecBytes = 128*1024 - 1024

// InvalidError says why a Job or StatefulSet (or a group of them) cannot be served, and how to fix it. Reason is one of
// the Reason* constants and becomes the reason of the Warning Event.
type InvalidError struct {
	Reason  string
	Message string
}

func (e *InvalidError) Error() string { return e.Message }

func invalidf(reason, format string, args ...any) *InvalidError {
	return &InvalidError{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// BuildClusterSpec returns the value of TF_CONFIG's "cluster" for the task sets of one group in
// namespace: compact JSON, keys sorted, tasks in index order, so the same input always gives the same
// bytes. The evaluator is validated but left out. Any input it cannot turn into a cluster TensorFlow
// accepts, with names that resolve, gives an *InvalidError.
func BuildClusterSpec(namespace string, sets []TaskSet) ([]byte, error) {
	if err := validateTaskSets(namespace, sets); err != nil {
		return nil, err
	}
	byRole := make(map[Role]TaskSet, len(sets))
	for _, s := range sets {
		byRole[s.Role] = s
	}

	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	for _, role := range Roles {
		s, ok := byRole[role]
		if !ok || !role.inCluster() {
			continue
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		// Names were validated as DNS labels, so nothing below needs JSON escaping.
		buf.WriteString(`"` + string(role) + `":[`)
		suffix := "." + s.Subdomain + "." + namespace + ".svc:" + strconv.Itoa(int(s.Port)) + `"`
		for i := int32(0); i < s.Replicas; i++ {
			if i > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(`"` + s.JobName + "-" + strconv.Itoa(int(i)) + suffix)
			// Checked while writing so a huge replica count costs at most the limit in memory.
			if buf.Len() > MaxClusterSpecBytes {
				return nil, invalidf(ReasonClusterTooLarge,
					"the cluster spec would exceed %d bytes (the kernel's limit for one environment variable is 128 KiB): use fewer tasks or shorter Job, subdomain and namespace names", MaxClusterSpecBytes)
			}
		}
		buf.WriteByte(']')
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func validateTaskSets(namespace string, sets []TaskSet) error {
	if len(sets) == 0 {
		return invalidf(ReasonInvalidGroup, "no Jobs or StatefulSets to build a cluster from")
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return invalidf(ReasonInvalidName, "namespace %q is not a DNS label: %s", namespace, strings.Join(errs, "; "))
	}
	seenRole := map[Role]TaskSet{}
	seenJob := map[string]bool{}
	trainers := 0
	for _, s := range sets {
		if err := validateTaskSet(s); err != nil {
			return err
		}
		if other, dup := seenRole[s.Role]; dup {
			return invalidf(ReasonInvalidGroup, "%s and %s both have role %s: give each role exactly one Job or StatefulSet", other.owner(), s.owner(), s.Role)
		}
		seenRole[s.Role] = s
		// Pod hostnames, and so addresses and Secret names, would collide.
		if seenJob[s.JobName] {
			return invalidf(ReasonInvalidGroup, "%q is listed twice: give every Job and StatefulSet of a group its own name", s.JobName)
		}
		seenJob[s.JobName] = true
		if s.Role == RoleChief || s.Role == RoleWorker {
			trainers++
		}
	}
	if trainers == 0 {
		roles := make([]string, 0, len(seenRole))
		for r := range seenRole {
			roles = append(roles, string(r))
		}
		sort.Strings(roles)
		return invalidf(ReasonInvalidGroup, "the cluster has roles [%s] but no chief or worker: add a Job or StatefulSet with role worker (or chief)", strings.Join(roles, ","))
	}
	return nil
}

func validateTaskSet(s TaskSet) error {
	if _, err := ParseRole(string(s.Role)); err != nil {
		return err
	}
	if s.Replicas < 1 {
		return invalidf(ReasonInvalidReplicas, "%s has %d tasks: set %s to at least 1", s.owner(), s.Replicas, s.sizeFields())
	}
	if (s.Role == RoleChief || s.Role == RoleEvaluator) && s.Replicas != 1 {
		return invalidf(ReasonInvalidReplicas, "%s has role %s with %d tasks, but TensorFlow allows one %s: set %s to 1", s.owner(), s.Role, s.Replicas, s.Role, s.sizeFields())
	}
	// Every pod hostname is <name>-<index>; the longest is the last index.
	lastHost := s.JobName + "-" + strconv.Itoa(int(s.Replicas-1))
	if errs := validation.IsDNS1123Label(lastHost); len(errs) > 0 {
		kind := "Job"
		if s.isStatefulSet() {
			kind = "StatefulSet"
		}
		return invalidf(ReasonInvalidName, "pod hostname %q of %s is not a DNS label (%s): use a shorter %s name of lowercase letters, digits and '-'", lastHost, s.owner(), strings.Join(errs, "; "), kind)
	}
	if !s.Role.inCluster() {
		return nil
	}
	field := "subdomain"
	if s.isStatefulSet() {
		field = "serviceName"
	}
	if s.Subdomain == "" {
		if s.isStatefulSet() {
			// serviceName is immutable, so the fix is a new StatefulSet.
			return invalidf(ReasonMissingServiceName, "%s has no spec.serviceName, so its pods get no DNS names: re-create it with one (for example its own name); a headless Service of that name is created if none exists", s.owner())
		}
		return invalidf(ReasonMissingSubdomain, "%s has no spec.template.spec.subdomain, so its pods get no DNS names: set it (for example to the Job's name); a headless Service of that name is created if none exists", s.owner())
	}
	// The headless Service that gives the pods their names is called like the subdomain, and Service
	// names are DNS-1035 labels: a subdomain starting with a digit would never resolve.
	if errs := validation.IsDNS1035Label(s.Subdomain); len(errs) > 0 {
		return invalidf(ReasonInvalidName, "%s %q of %s cannot be a Service name (%s): use lowercase letters, digits and '-', starting with a letter", field, s.Subdomain, s.owner(), strings.Join(errs, "; "))
	}
	if s.Port < 1 || s.Port > 65535 {
		return invalidf(ReasonInvalidPort, "%s: port %d is out of range: give the container port named %s a number from 1 to 65535", s.owner(), s.Port, PortName)
	}
	return nil
}
