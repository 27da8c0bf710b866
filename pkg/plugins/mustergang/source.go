package mustergang

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	appslisters "k8s.io/client-go/listers/apps/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// gangSource answers, from the scheduler's informers, which gang a pod
// belongs to, what the gang's owner asks (quorum, timeout, topology), which
// of its pods are live, and which object speaks for it.
type gangSource struct {
	handle fwk.Handle    // the framework's own PodGroups (GenericWorkload)
	gangs  *gang.Manager // members in flight, members that finished
	levels []gang.Level
	// defaultTimeout is a plan's deadline unless the PodGroup sets one.
	defaultTimeout time.Duration

	// pods is the pod informer's store; gangIndex this profile's index of
	// it by gang (gangIndexFunc).
	pods      cache.Indexer
	gangIndex string
	jobs      batchlisters.JobLister
	sets      appslisters.StatefulSetLister
	podGroups cache.GenericLister // nil when the PodGroup CRD is not served
	// podGroupsSynced reports whether the PodGroup informer has listed
	// every PodGroup; it starts only when this replica schedules
	// (watchPodGroups).
	podGroupsSynced cache.InformerSynced
	pgClient        *v1alpha1.Client
	// lastQuorum is quorumReachedWith's last answer; lastCount keptLiveCount's,
	// valid while podEvents (the pod events the plugin's handlers saw)
	// stays the same.
	lastQuorum atomic.Pointer[quorumAnswer]
	lastCount  atomic.Pointer[countAnswer]
	podEvents  atomic.Uint64
	// facts is what planning reads of each pending member, kept per object.
	facts pendingFacts
}

// resolve finds the pod's gang, what its owner asks and the pod's own
// placement annotations (gang.Resolver); info is never nil. inGang is
// false for a pod scheduled alone; err explains an invalid annotation, or
// a gang that cannot be served yet or at all.
func (src *gangSource) resolve(pod *v1.Pod) (info *gang.Resolved, inGang bool, err error) {
	r, inGang, err := gang.Resolver{Owners: src, Levels: src.levels, Succeeded: src.gangs.Succeeded, DefaultTimeout: src.defaultTimeout}.Resolve(pod)
	return &r, inGang, err
}

// ownerOf reads the object that defines gang key from the informers
// (gang.OwnerOf); for a pod scheduled alone that preempted, the pod itself.
func (src *gangSource) ownerOf(key gang.Key) (runtime.Object, error) {
	if key.Kind == gang.KindPod {
		if pod := src.lonePod(key); pod != nil {
			return pod, nil
		}
		return nil, fmt.Errorf("pod %s/%s is gone", key.Namespace, key.Name)
	}
	return gang.OwnerOf(key, src)
}

// Job, StatefulSet, PodGroup and WorkloadPodGroup read gangs' owners from
// the informers, for gang.OwnerOf.

func (src *gangSource) Job(namespace, name string) (*batchv1.Job, error) {
	return src.jobs.Jobs(namespace).Get(name)
}

func (src *gangSource) StatefulSet(namespace, name string) (*appsv1.StatefulSet, error) {
	return src.sets.StatefulSets(namespace).Get(name)
}

// errPodGroupsNotListed: muster lists PodGroups once it schedules
// (watchPodGroups), and the list is not in yet. Not "not found": the
// PodGroup may well exist. PreEnqueue holds its pods, without a word,
// until wakePodGroupGangs wakes them.
var errPodGroupsNotListed = errors.New("muster has not finished listing PodGroups since it became the leader")

func (src *gangSource) PodGroup(namespace, name string) (*v1alpha1.PodGroup, error) {
	if src.podGroups == nil {
		return nil, fmt.Errorf("gang %s: pod has label %s but the PodGroup API (podgroups.scheduling.x-k8s.io) is not installed; apply manifests/crds and restart muster",
			gang.Key{Kind: gang.KindPodGroup, Namespace: namespace, Name: name}, v1alpha1.PodGroupLabel)
	}
	if !src.podGroupsSynced() {
		return nil, fmt.Errorf("gang %s: %w", gang.Key{Kind: gang.KindPodGroup, Namespace: namespace, Name: name}, errPodGroupsNotListed)
	}
	obj, err := src.podGroups.ByNamespace(namespace).Get(name)
	if err != nil {
		return nil, err
	}
	return v1alpha1.FromUnstructured(obj)
}

// ownerRef is the object Events about gang key are recorded on (nil when
// it cannot be read): its speaker's.
func (src *gangSource) ownerRef(key gang.Key) *v1.ObjectReference {
	obj, err := src.ownerOf(src.speaker(key))
	if err != nil {
		return nil
	}
	return gang.Reference(obj)
}

// speaker is the gang whose object speaks for gang key to users: Events,
// the failed plan's record. It is the owner gang.Resolve finds for the
// gang's pods: a Kubernetes PodGroup of the basic policy (with
// WorkloadWithJob every Job gets one) is no gang, and its pods' Job or
// StatefulSet speaks, the one kubectl muster reads for them. Every other
// gang speaks for itself.
func (src *gangSource) speaker(key gang.Key) gang.Key {
	if key.Kind != gang.KindWorkloadPodGroup {
		return key
	}
	objs, _ := src.pods.ByIndex(src.gangIndex, key.String())
	for _, o := range objs {
		if r, _, _ := (gang.Resolver{Owners: src, Levels: src.levels}).Resolve(o.(*v1.Pod)); r.Key == key && r.OwnerKey != (gang.Key{}) {
			return r.OwnerKey
		}
	}
	return key
}

// memberSet is a gang's live pods as the scheduler sees them.
type memberSet struct {
	// pending members (unbound, not being deleted, not already allowed, not
	// held by a scheduling gate), sorted by name.
	pending []*v1.Pod
	// boundNodes has one entry per member bound in the API or allowed and
	// binding: the node it is on; boundUIDs are those members.
	boundNodes []string
	boundUIDs  []types.UID
	// total counts every live member, gated ones included.
	total int
}

func (m memberSet) bound() int { return len(m.boundNodes) }

// members lists the gang's live pods of this plugin's profile.
func (src *gangSource) members(key gang.Key) memberSet {
	return src.membersIn(src.gangIndex, key)
}

// liveCount counts the gang's live pods (gated ones included): members'
// total without sorting or classifying them.
func (src *gangSource) liveCount(key gang.Key) int {
	if key.Kind == gang.KindPod {
		return len(src.standingPods(src.gangIndex, key))
	}
	objs, _ := src.pods.ByIndex(src.gangIndex, key.String())
	n := 0
	for _, obj := range objs {
		if obj.(*v1.Pod).DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

// currentQuorum is the gang's quorum as its owner says now, read through
// one of its pods; last when the gang has no pod or it cannot be read.
func (src *gangSource) currentQuorum(key gang.Key, last int) int {
	pods := src.standingPods(src.gangIndex, key)
	if len(pods) == 0 {
		return last
	}
	if info, inGang, err := src.resolve(pods[0]); inGang && err == nil {
		return info.Quorum
	}
	return last
}

// keptLiveCount is liveCount, the same answer again until the pod
// informer's next event. PreEnqueue asks it for every member of a native
// PodGroup each time one member is added (the framework queues the group
// as one entry and runs PreEnqueue on all of it): for a group of 1000
// created pod by pod, a million calls, which counting each time turned
// into minutes under the queue's lock.
//
// The count is read after the event counter, so a kept count is never
// older than its counter: an event whose store change it missed moves the
// counter when its handler runs (onPodAdd then wakes a gang that reached
// its quorum), and PreFilter counts again before planning.
func (src *gangSource) keptLiveCount(key gang.Key) int {
	events := src.podEvents.Load()
	if last := src.lastCount.Load(); last != nil && last.key == key && last.events == events {
		return last.n
	}
	n := src.liveCount(key)
	src.lastCount.Store(&countAnswer{key: key, events: events, n: n})
	return n
}

// countAnswer is keptLiveCount's last answer: gang key had n live pods when
// the pod informer had delivered events events to the plugin.
type countAnswer struct {
	key    gang.Key
	events uint64
	n      int
}

// podEvent is called first by each of the plugin's pod handlers: it ends
// the life of keptLiveCount's answer.
func (src *gangSource) podEvent() { src.podEvents.Add(1) }

// quorumReachedWith reports whether the gang of added, a member just
// added, has its quorum of live pods (true when it cannot tell: the caller
// then wakes rather than strands). The framework asks it once for every
// held sibling with the same added pod, so the last answer is kept.
func (src *gangSource) quorumReachedWith(added *v1.Pod) bool {
	if src == nil { // no informers to tell from
		return true
	}
	if last := src.lastQuorum.Load(); last != nil && last.uid == added.UID && last.version == added.ResourceVersion {
		return last.reached
	}
	info, inGang, _ := src.resolve(added)
	reached := !inGang || info.Quorum == 0 || src.liveCount(info.Key) >= info.Quorum
	src.lastQuorum.Store(&quorumAnswer{uid: added.UID, version: added.ResourceVersion, reached: reached})
	return reached
}

// quorumAnswer is quorumReachedWith's last answer, for one version of one
// pod.
type quorumAnswer struct {
	uid     types.UID
	version string
	reached bool
}

// membersInFlight is members with the members in flight as the gang
// manager told them (Planning.InFlight), not asked again.
func (src *gangSource) membersInFlight(key gang.Key, inFlight map[types.UID]string) memberSet {
	return src.classify(src.gangIndex, key, inFlight)
}

// pendingInAnyProfile lists the gang's pending members of every profile:
// a plan dropped in one profile frees capacity for the gangs of all of
// them. The profiles share the pod informer, each with its own gang index,
// and the scheduling queue.
func (src *gangSource) pendingInAnyProfile(key gang.Key) []*v1.Pod {
	var pending []*v1.Pod
	for _, index := range src.gangIndexes() {
		pending = append(pending, src.membersIn(index, key).pending...)
	}
	return pending
}

// gangHasPods reports whether any profile's gang index still holds a pod
// of the gang: the gang manager is shared by the profiles.
func (src *gangSource) gangHasPods(key gang.Key) bool {
	for _, index := range src.gangIndexes() {
		if objs, _ := src.pods.ByIndex(index, key.String()); len(objs) > 0 {
			return true
		}
	}
	return false
}

// lonePod is the pod of a lone pod's key (gang.LoneKey), nil when it is
// gone.
func (src *gangSource) lonePod(key gang.Key) *v1.Pod {
	if obj, ok, _ := src.pods.GetByKey(key.Namespace + "/" + key.Name); ok {
		return obj.(*v1.Pod)
	}
	return nil
}

// live says, for Manager.Arrive, whether a member of gang key still stands
// in the pod informer: neither deleted nor terminating. The informer's
// store changes before any handler runs, the framework's (which rejects a
// deleted member waiting at Permit) and muster's alike. It reads the store
// at its first call only.
func (src *gangSource) live(key gang.Key) func(types.UID) bool {
	var standing sets.Set[types.UID]
	return func(uid types.UID) bool {
		if standing == nil {
			standing = sets.New[types.UID]()
			for _, pod := range src.standingPods(src.gangIndex, key) {
				standing.Insert(pod.UID)
			}
		}
		return standing.Has(uid)
	}
}

// stands reports whether pod is still in the pod informer (terminating or
// not): a pod gone from it had its deletion handled.
func (src *gangSource) stands(pod *v1.Pod) bool {
	obj, ok, _ := src.pods.GetByKey(pod.Namespace + "/" + pod.Name)
	return ok && obj.(*v1.Pod).UID == pod.UID
}

// standingPods are the gang's pods in the pod informer's gang index that
// are not terminating; a lone pod's key (a pod scheduled alone that
// preempted, a gang of itself) names its pod only.
func (src *gangSource) standingPods(index string, key gang.Key) []*v1.Pod {
	var objs []interface{}
	if key.Kind == gang.KindPod {
		if pod := src.lonePod(key); pod != nil {
			objs = append(objs, pod)
		}
	} else {
		objs, _ = src.pods.ByIndex(index, key.String())
	}
	pods := make([]*v1.Pod, 0, len(objs))
	for _, obj := range objs {
		if pod := obj.(*v1.Pod); pod.DeletionTimestamp == nil {
			pods = append(pods, pod)
		}
	}
	return pods
}

// gangEnded reports whether the gang is over: it has no pods left (a lone
// pod's key: its pod is gone) and, for a PodGroup, its object is gone too.
// A PodGroup's finished members are counted on the gang (Manager.Succeed)
// as long as the object stands: the last member's success is recorded
// after it left the informer, and a new PodGroup of the same name starts
// from none.
func (src *gangSource) gangEnded(key gang.Key) bool {
	if key.Kind == gang.KindPod {
		return src.lonePod(key) == nil
	}
	if src.gangHasPods(key) {
		return false
	}
	if key.Kind == gang.KindPodGroup {
		if _, err := src.ownerOf(key); err == nil {
			return false
		}
	}
	return true
}

// gangIndexes are the pod informer's gang indexes, one per muster profile.
func (src *gangSource) gangIndexes() []string {
	var out []string
	for name := range src.pods.GetIndexers() {
		if strings.HasPrefix(name, gangIndexPrefix) {
			out = append(out, name)
		}
	}
	return out
}

// membersIn lists the gang's live pods in the pod informer's gang index.
func (src *gangSource) membersIn(index string, key gang.Key) memberSet {
	return src.classify(index, key, src.gangs.InFlight(key))
}

// classify sorts the gang's live pods in the index into bound (in the API
// or in flight) and pending.
func (src *gangSource) classify(index string, key gang.Key, inFlight map[types.UID]string) memberSet {
	var set memberSet
	for _, pod := range src.standingPods(index, key) {
		set.total++
		if node, ok := inFlight[pod.UID]; pod.Spec.NodeName != "" || ok {
			if pod.Spec.NodeName != "" {
				node = pod.Spec.NodeName
			}
			set.boundNodes = append(set.boundNodes, node)
			set.boundUIDs = append(set.boundUIDs, pod.UID)
			continue
		}
		if len(pod.Spec.SchedulingGates) > 0 {
			// Another controller holds it back; planning it would hold
			// capacity for a pod that cannot come.
			continue
		}
		set.pending = append(set.pending, pod)
	}
	sort.Slice(set.pending, func(i, j int) bool { return set.pending[i].Name < set.pending[j].Name })
	sort.Strings(set.boundNodes)
	return set
}

// gangIndexPrefix names the pod informer's gang index; one index per
// profile, because every profile's QueueSort is MusterGang (kube-scheduler
// requires one QueueSort for all profiles) and they share the informer.
const gangIndexPrefix = "muster.dev/gang/"

// gangIndexFunc indexes the pods of profile by their gang.
func gangIndexFunc(profile string) cache.IndexFunc {
	return func(obj interface{}) ([]string, error) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.SchedulerName != profile {
			return nil, nil
		}
		key, ok := gang.KeyOf(pod)
		if !ok {
			return nil, nil
		}
		if key.Kind == gang.KindWorkloadPodGroup {
			// A basic PodGroup's quorum is its Job's or StatefulSet's:
			// the owner's handler finds the group through the pod.
			if owner, ok := gang.ControllerKey(pod); ok {
				return []string{key.String(), controlledBy(owner)}, nil
			}
		}
		return []string{key.String()}, nil
	}
}

// controlledBy is the gang index value of the pods in Kubernetes PodGroups
// whose controller is the Job or StatefulSet owner.
func controlledBy(owner gang.Key) string { return "controlled-by " + owner.String() }

// groupsControlledBy are the Kubernetes PodGroups of owner's pods.
func (src *gangSource) groupsControlledBy(owner gang.Key) []gang.Key {
	objs, _ := src.pods.ByIndex(src.gangIndex, controlledBy(owner))
	var groups []gang.Key
	for _, o := range objs {
		if key, ok := gang.KeyOf(o.(*v1.Pod)); ok && !slices.Contains(groups, key) {
			groups = append(groups, key)
		}
	}
	return groups
}
