package mustergang

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	applyv1 "k8s.io/client-go/applyconfigurations/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/muster-sched/muster/pkg/gang"
)

// maxPreemptionDryRuns bounds the victim search: each candidate set costs
// one plan (with the framework's filters) on the snapshot without it.
const maxPreemptionDryRuns = 256

// victimUnit is a whole gang's bound members, or one lone pod.
type victimUnit struct {
	gang.VictimUnit
	key  gang.Key // the victim gang; zero for a lone pod
	pods []*v1.Pod
}

// preempt makes room for a gang (or a pod scheduled alone) that cannot be
// planned, by evicting whole lower-priority gangs or lone pods: the set
// with the fewest PodDisruptionBudget violations, then the fewest GPUs,
// then the fewest units, then the lowest priority, then the most recently
// started, and only if the gang's plan passes the framework's filters with
// them gone. The plan is installed at once (its slots held in the ledger,
// this pod nominated to its slot); the members wait until the victims have
// terminated.
func (p *Plugin) preempt(ctx context.Context, pod *v1.Pod) (*fwk.PostFilterResult, *fwk.Status) {
	logger := klog.FromContext(ctx)
	if !p.args.GangPreemption {
		return nil, fwk.NewStatus(fwk.Unschedulable, "gang preemption is off")
	}
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return nil, fwk.NewStatus(fwk.Unschedulable, "not eligible for preemption: preemptionPolicy is Never")
	}
	constraints, err := gang.ConstraintsFromPod(pod, p.levels)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	info, inGang, err := p.resolve(pod)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	if !inGang {
		info = &gangInfo{key: gang.LoneKey(pod), quorum: 1, timeout: time.Duration(p.args.DefaultScheduleTimeoutSeconds) * time.Second, owner: pod}
	} else if outcome, _ := p.registry.LastNotice(info.key); outcome != gang.OutcomeUnschedulable {
		// Waiting for members, backing off, invalid: eviction cannot help.
		return nil, fwk.NewStatus(fwk.Unschedulable, "gang is not waiting for capacity")
	}
	key := info.key
	if p.registry.Plan(key) != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "gang has a plan")
	}
	if !p.registry.TryPreemption(key, p.now(), time.Duration(max(p.args.GangBackoffSeconds, 1))*time.Second) {
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s tried preemption recently", key))
	}
	nodes, err := p.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	gr, status := p.prepareGang(ctx, pod, info, constraints)
	if status != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, status.Message())
	}
	views, _ := p.nodeViews(nodes)
	units := p.victimUnits(nodes, views, key, corev1helpers.PodPriority(pod), constraints.Policy)
	if len(units) == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: no lower-priority pods to preempt", key))
	}
	candidates := make([]gang.VictimUnit, len(units))
	for i, u := range units {
		candidates[i] = u.VictimUnit
	}
	var plan *gang.Plan
	var victims []*v1.Pod
	chosen, found := gang.ChooseVictims(candidates, func(indexes []int) bool {
		var pods []*v1.Pod
		for _, i := range indexes {
			pods = append(pods, units[i].pods...)
		}
		planned, _, err := p.computePlan(ctx, gr, views, pods)
		if err != nil {
			return false
		}
		plan, victims = planned, pods
		return true
	}, maxPreemptionDryRuns)
	if !found {
		msg := fmt.Sprintf("gang %s: preempting lower-priority pods would not make room either", key)
		logger.V(2).Info("No preemption helps", "gang", key, "candidateUnits", len(units))
		return nil, fwk.NewStatus(fwk.Unschedulable, msg)
	}

	active, status := p.installPlan(ctx, pod, gr, plan, victims)
	if status != nil {
		return nil, status
	}
	var gpus int64
	var names []string
	for _, i := range chosen {
		gpus += units[i].GPUs
		names = append(names, units[i].Name)
	}
	sort.Strings(names)
	preemptions.Inc()
	preemptedGPUs.Add(float64(gpus))
	msg := fmt.Sprintf("gang %s preempts %d pods of %s (%d %s) to run in %s %s",
		key, len(victims), strings.Join(names, ", "), gpus, p.args.GPUResourceName, plan.Level, plan.Domain)
	logger.Info("Preempting for gang", "gang", key, "victims", names, "pods", len(victims), "gpus", gpus)
	p.noticeKey(ctx, key, gang.OutcomePreempting, msg)
	if !inGang {
		p.podEvent(pod, gang.OutcomePreempting, msg)
	}
	for _, i := range chosen {
		p.recordVictim(ctx, units[i], key)
	}
	// Counted before the goroutine starts, so whoever watches the gauge never
	// sees an eviction as done before it began.
	evictions := schedmetrics.Goroutines.WithLabelValues(EvictionOperation)
	evictions.Inc()
	go func() {
		defer evictions.Dec()
		p.evict(context.WithoutCancel(ctx), victims, pod, key)
	}()
	return framework.NewPostFilterResultWithNominatedNode(active.Slots[pod.UID]),
		fwk.NewStatus(fwk.Unschedulable, msg+"; waiting for them to terminate")
}

// victimUnits groups the snapshot's pods into whole gangs (every bound
// member, wherever it runs, whichever scheduler placed it) and lone pods,
// and keeps the units entirely below priority prio, with no member already
// terminating or chosen by another preemption, and with a pod on a node the
// preemptor's policy may use (views[i] is nodes[i]'s, from nodeViews).
func (p *Plugin) victimUnits(nodes []fwk.NodeInfo, views []gang.NodeView, preemptor gang.Key, prio int32, policy gang.Policy) []*victimUnit {
	gpu := v1.ResourceName(p.args.GPUResourceName)
	byName := map[string]*victimUnit{}
	useful := map[string]bool{}
	protected := map[string]bool{}
	for i, ni := range nodes {
		if ni.Node() == nil {
			continue
		}
		eligible := !views[i].Unavailable() && !policy.Excludes(views[i].Preemptible)
		for _, pi := range ni.GetPods() {
			pod := pi.GetPod()
			name, key := "pod "+pod.Namespace+"/"+pod.Name, gang.Key{}
			if k, ok := gang.KeyOf(pod); ok {
				name, key = "gang "+k.String(), k
			}
			if key == preemptor {
				continue
			}
			if corev1helpers.PodPriority(pod) >= prio || pod.DeletionTimestamp != nil || p.registry.IsVictim(pod.UID) {
				protected[name] = true // the whole unit, never a part of it
				continue
			}
			u := byName[name]
			if u == nil {
				u = &victimUnit{key: key, VictimUnit: gang.VictimUnit{Name: name, Priority: corev1helpers.PodPriority(pod)}}
				byName[name] = u
			}
			u.pods = append(u.pods, pod)
			u.Pods++
			u.GPUs += pi.CalculateResource().Resource.GetScalarResources()[gpu]
			u.Priority = max(u.Priority, corev1helpers.PodPriority(pod))
			started := pod.CreationTimestamp.Time
			if pod.Status.StartTime != nil {
				started = pod.Status.StartTime.Time
			}
			if started.After(u.Started) {
				u.Started = started
			}
			if eligible {
				useful[name] = true
			}
		}
	}
	var units []*victimUnit
	for name, u := range byName {
		// A gang with a plan in progress has members waiting at Permit;
		// it is not a victim while it is being placed.
		if !useful[name] || protected[name] || (u.key != gang.Key{} && p.registry.Plan(u.key) != nil) {
			continue
		}
		u.ViolatesPDB = p.violatesPDB(u.pods)
		units = append(units, u)
	}
	sort.Slice(units, func(i, j int) bool { return units[i].Name < units[j].Name })
	return units
}

// violatesPDB reports whether evicting pods exceeds the disruptions a
// PodDisruptionBudget still allows, as DefaultPreemption counts them.
func (p *Plugin) violatesPDB(pods []*v1.Pod) bool {
	if p.pdbs == nil {
		return false
	}
	evicted := map[*policyv1.PodDisruptionBudget]int32{}
	for _, pod := range pods {
		pdbs, err := p.pdbs.PodDisruptionBudgets(pod.Namespace).List(labels.Everything())
		if err != nil {
			continue
		}
		for _, pdb := range pdbs {
			selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || selector.Empty() || !selector.Matches(labels.Set(pod.Labels)) {
				continue
			}
			evicted[pdb]++
			if evicted[pdb] > pdb.Status.DisruptionsAllowed {
				return true
			}
		}
	}
	return false
}

// recordVictim tells a victim gang (or the lone pod) why it is evicted.
func (p *Plugin) recordVictim(ctx context.Context, u *victimUnit, preemptor gang.Key) {
	msg := fmt.Sprintf("preempted by higher-priority gang %s: %d pods, %d %s", preemptor, u.Pods, u.GPUs, p.args.GPUResourceName)
	if u.key != (gang.Key{}) {
		if ref := p.ownerRef(u.key); ref != nil {
			p.handle.EventRecorder().Eventf(ref, nil, v1.EventTypeWarning, ReasonPreempted, "Preempting", "%s", msg)
		}
		return
	}
	p.handle.EventRecorder().Eventf(u.pods[0], nil, v1.EventTypeWarning, ReasonPreempted, "Preempting", "%s", msg)
}

// EvictionOperation is the operation label of scheduler_goroutines while
// victims of a gang preemption are being deleted.
const EvictionOperation = "MusterGangEviction"

// evict marks each victim with the DisruptionTarget condition, as
// DefaultPreemption does, and deletes it (with its grace period).
func (p *Plugin) evict(ctx context.Context, victims []*v1.Pod, preemptor *v1.Pod, key gang.Key) {
	logger := klog.FromContext(ctx)
	client := p.handle.ClientSet()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, v := range victims {
		condition := applyv1.PodCondition().
			WithType(v1.DisruptionTarget).
			WithStatus(v1.ConditionTrue).
			WithReason(v1.PodReasonPreemptionByScheduler).
			WithMessage(fmt.Sprintf("%s: preempting to accommodate gang %s", preemptor.Spec.SchedulerName, key)).
			WithLastTransitionTime(metav1.Now())
		apply := applyv1.Pod(v.Name, v.Namespace).WithStatus(applyv1.PodStatus().WithConditions(condition))
		if _, err := client.CoreV1().Pods(v.Namespace).ApplyStatus(ctx, apply, metav1.ApplyOptions{FieldManager: "muster-scheduler", Force: true}); err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "Could not add the DisruptionTarget condition", "victim", klog.KObj(v), "gang", key)
		}
		err := client.CoreV1().Pods(v.Namespace).Delete(ctx, v.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(v.UID))})
		if err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "Could not preempt victim", "victim", klog.KObj(v), "gang", key)
			continue
		}
		logger.V(2).Info("Preempted", "victim", klog.KObj(v), "gang", key)
	}
}
