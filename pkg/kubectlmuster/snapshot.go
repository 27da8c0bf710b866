// Package kubectlmuster is the kubectl-muster plugin: it lists the gangs
// muster knows of, explains why one waits and what would make it fit, and
// shows free GPUs per topology domain. It only reads the cluster, one List
// per resource, and plans with muster's own planner (pkg/gang) on what it
// read; it never imports the scheduler framework.
package kubectlmuster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/muster-sched/muster/pkg/apis/config"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// Options are what every command needs to read the cluster as muster does.
type Options struct {
	// SchedulerName is the schedulerName of muster's pods.
	SchedulerName string
	// GPU is the GPU resource (muster's gpuResourceName).
	GPU corev1.ResourceName
	// Levels are the topology levels, tightest first (muster's
	// topologyLevels; the default preset unless told otherwise).
	Levels []gang.Level
	// Spot recognises preemptible nodes; Reclaim lists the taints that
	// announce a node is going away (muster's defaults).
	Spot    []configv1.NodeMatcher
	Reclaim []string
	// WorkerGPUs is the worker size top reports the largest gang of.
	WorkerGPUs int64
}

// DefaultOptions are muster's defaults (pkg/apis/config/v1).
func DefaultOptions() Options {
	return Options{
		SchedulerName: "muster",
		GPU:           configv1.DefaultGPUResourceName,
		Levels:        PresetLevels(configv1.DefaultTopologyPreset),
		Spot:          configv1.DefaultPreemptibleNodeMatchers(),
		Reclaim:       configv1.DefaultReclaimTaintKeys(),
		WorkerGPUs:    8,
	}
}

// PresetLevels are the label levels of a topology preset (nil for an
// unknown preset).
func PresetLevels(preset string) []gang.Level {
	var levels []gang.Level
	for _, l := range configv1.TopologyPresets[preset] {
		levels = append(levels, gang.Level{Name: l.Name, Label: l.NodeLabel})
	}
	return levels
}

// ParseLevels reads muster's topologyLevels written NAME=NODE_LABEL,...,
// tightest first, as kubectl muster's --topology-levels takes them, and
// checks them as muster's configuration does. Levels of a DRA device
// attribute are not taken: kubectl muster reads no ResourceSlices.
func ParseLevels(s string) ([]gang.Level, error) {
	var configured []config.TopologyLevel
	for _, item := range strings.Split(s, ",") {
		name, label, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return nil, fmt.Errorf("level %q is not NAME=NODE_LABEL", item)
		}
		configured = append(configured, config.TopologyLevel{Name: name, NodeLabel: label})
	}
	if err := config.ValidateTopologyLevels(field.NewPath("topologyLevels"), configured); err != nil {
		return nil, err
	}
	levels := make([]gang.Level, len(configured))
	for i, l := range configured {
		levels[i] = gang.Level{Name: l.Name, Label: l.NodeLabel}
	}
	return levels, nil
}

// Clients reach the cluster. Dynamic reads scheduler-plugins PodGroups; nil
// skips them.
type Clients struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// Scope is where a command looks: one namespace, or all of them.
type Scope struct {
	Namespace     string
	AllNamespaces bool
}

func (s Scope) listNamespace() string {
	if s.AllNamespaces {
		return metav1.NamespaceAll
	}
	return s.Namespace
}

func (s Scope) where() string {
	if s.AllNamespaces {
		return " in any namespace"
	}
	return fmt.Sprintf(" in namespace %q", s.Namespace)
}

// Snapshot is the state a command works on, read with one List per
// resource.
type Snapshot struct {
	Now   time.Time
	Nodes []corev1.Node
	// Pods are the scope's pods, or every pod when the command accounts
	// for node capacity (AllPods).
	Pods           []corev1.Pod
	AllPods        bool
	Jobs           []batchv1.Job
	StatefulSets   []appsv1.StatefulSet
	PodGroups      []v1alpha1.PodGroup
	WorkloadGroups []schedulingv1beta1.PodGroup
	Events         []eventsv1.Event
	PVCs           []corev1.PersistentVolumeClaim
	// Skipped says, once each, which kinds the cluster does not serve.
	Skipped []string
	// PVCsRead: PVCs were listed (explain only).
	PVCsRead bool
	// KueueServed: Kueue's Workloads were listed (KueueWorkloads); the
	// LocalQueues' ClusterQueues by namespace/name when they could be.
	KueueServed      bool
	KueueWorkloads   []kueueWorkload
	KueueLocalQueues map[string]string
}

// reads says which lists a command needs.
type reads struct {
	allPods bool // every pod, for node accounting
	owners  bool // Jobs, StatefulSets, PodGroups, Events
	pvcs    bool
}

// ErrForbidden marks a List the user may not do.
var ErrForbidden = errors.New("forbidden")

// read takes the snapshot a command needs.
func read(ctx context.Context, c Clients, scope Scope, r reads) (*Snapshot, error) {
	s := &Snapshot{Now: time.Now(), AllPods: r.allPods}
	ns := scope.listNamespace()
	if !scope.AllNamespaces {
		if err := checkNamespace(ctx, c.Kube, scope.Namespace); err != nil {
			return nil, err
		}
	}
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, listError(err, "nodes", "")
	}
	s.Nodes = nodes.Items
	podScope := scope
	if r.allPods {
		podScope = Scope{AllNamespaces: true}
	}
	pods, err := c.Kube.CoreV1().Pods(podScope.listNamespace()).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, listError(err, "pods", podScope.where())
	}
	s.Pods = pods.Items
	if !r.owners {
		return s, nil
	}
	jobs, err := c.Kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, listError(err, "jobs.batch", scope.where())
	}
	s.Jobs = jobs.Items
	sets, err := c.Kube.AppsV1().StatefulSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, listError(err, "statefulsets.apps", scope.where())
	}
	s.StatefulSets = sets.Items
	events, err := c.Kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, listError(err, "events.events.k8s.io", scope.where())
	}
	s.Events = events.Items

	if err := readPodGroups(ctx, c, scope, s); err != nil {
		return nil, err
	}
	if err := readKueue(ctx, c, ns, s); err != nil {
		return nil, err
	}
	if r.pvcs {
		pvcs, err := c.Kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, listError(err, "persistentvolumeclaims", scope.where())
		}
		s.PVCs, s.PVCsRead = pvcs.Items, true
	}
	return s, nil
}

// readPodGroups reads both kinds of PodGroup into s, where their API is
// served (each skipped with a note where it is not).
func readPodGroups(ctx context.Context, c Clients, scope Scope, s *Snapshot) error {
	ns := scope.listNamespace()
	served, err := servedResource(c.Kube, v1alpha1.SchemeGroupVersion.String(), "podgroups")
	switch {
	case err != nil:
		return err
	case !served || c.Dynamic == nil:
		s.Skipped = append(s.Skipped, "podgroups.scheduling.x-k8s.io is not served (the PodGroup CRD is not installed): scheduler-plugins PodGroups are skipped")
	default:
		list, err := c.Dynamic.Resource(v1alpha1.Resource).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return listError(err, "podgroups.scheduling.x-k8s.io", scope.where())
		}
		for i := range list.Items {
			pg, err := v1alpha1.FromUnstructured(&list.Items[i])
			if err != nil {
				return err
			}
			s.PodGroups = append(s.PodGroups, *pg)
		}
	}
	served, err = servedResource(c.Kube, schedulingv1beta1.SchemeGroupVersion.String(), "podgroups")
	switch {
	case err != nil:
		return err
	case !served:
		s.Skipped = append(s.Skipped, "scheduling.k8s.io/v1beta1 is not served (GenericWorkload off): Kubernetes PodGroups are skipped")
	default:
		list, err := c.Kube.SchedulingV1beta1().PodGroups(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return listError(err, "podgroups.scheduling.k8s.io", scope.where())
		}
		s.WorkloadGroups = list.Items
	}
	return nil
}

// servedResource asks discovery whether groupVersion serves resource.
func servedResource(kube kubernetes.Interface, groupVersion, resource string) (bool, error) {
	list, err := kube.Discovery().ServerResourcesForGroupVersion(groupVersion)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("discovering %s: %w", groupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

// checkNamespace fails for a namespace that does not exist. A user who may
// not get namespaces is not stopped here: the lists that follow say what
// they may not do.
func checkNamespace(ctx context.Context, kube kubernetes.Interface, ns string) error {
	_, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("namespace %q not found", ns)
	case err != nil && !apierrors.IsForbidden(err):
		return fmt.Errorf("reading namespace %q: %w", ns, err)
	}
	return nil
}

// listError says which list failed, and for a forbidden one which verb on
// which resource the user lacks.
func listError(err error, resource, where string) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: you may not list %s%s (verb \"list\" on resource %q; ClusterRole muster-viewer grants it)",
			ErrForbidden, resource, where, resource)
	}
	return fmt.Errorf("listing %s%s: %w", resource, where, err)
}
