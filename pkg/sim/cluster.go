package sim

import (
	"fmt"
	"strconv"
	"sync/atomic"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// cluster is the simulator's cluster model: the fake clientset and its
// reactors (the API server's part), the objects the simulator writes into
// it (nodes, jobs, their pods, background pods, DRA slices) and its own
// record of them: which gang's pods are bound where, which nodes exist.
// It is changed only from the step loop's goroutine but for what the
// reactors and informer handlers record (binds, deletions, counts, dra).
type cluster struct {
	plan *scenario.Plan
	cs   *fake.Clientset
	// b is the scheduler the run drives: what its pods and PodGroups look
	// like (set once it is built).
	b   *built
	eng *engine
	rec *measure.Recorder
	// resourceVersion numbers every write: the fake tracker keeps object
	// versions to itself, and the scheduler ignores an update whose
	// resourceVersion did not change.
	resourceVersion *atomic.Int64
	counts          *counters
	binds           *bindLog
	deletions       *deletions
	changes         stepChanges
	nodes           nodeSet
	work            workload
	// bg is the realistic background (background.go).
	bg *background
	// dra is the DRA cluster's record (dra.go), nil without DRA.
	dra *draCluster
	// refusedPatches counts the Job patches refused for good
	// (soak.refuseJobPatches); nodesReplaced the spot nodes replaced.
	refusedPatches atomic.Int64
	nodesReplaced  int
}

// nodeSet is the cluster's nodes as the simulator knows them.
type nodeSet struct {
	byName map[string]*nodeSpec // change it through add and remove
	// capacityGPUs is the GPUs of the nodes, kept as nodes come and go
	// rather than summed in every step's sample.
	capacityGPUs int64
	slots        []string // spot slot → node filling it now ("" while empty)
	// pods are the gangs' bound pods on each node.
	pods map[string]map[string]bool
	// cpu and memory are a full node's (nodeResources).
	cpu, memory resource.Quantity
	// domains are the GPUs of the largest rack and zone (TAS constraints).
	domains domainGPUs
}

// workload is the plan's jobs as gangs, and who owns which pod.
type workload struct {
	gangs []*gangState
	// live are the gangs that arrived and are not done, in arrival order
	// (liveGangs drops the done ones): what each step's sample reads, so a
	// step costs the gangs in the cluster, not every job of a month.
	live     []*gangState
	finished int
	podGang  map[string]*gangState
	// lowestPriority is the plan's lowest job priority.
	lowestPriority int32
	// bindsApplied reads the bindings, each applied once to its gang
	// (collectBinds).
	bindsApplied *bindReader
	// fit binds pods for the None scheduler (nil for the others).
	fit *firstFit
}

// watchBuffer is the fake clientset's per-watcher event buffer. The fake
// panics when a watcher's buffer is full (default 100), and a step creates
// thousands of objects at once in the large scenarios.
const watchBuffer = 1 << 17

// newCluster builds the fake cluster of opts.Plan before any informer
// starts: the clientset with its reactors, the nodes, the background and
// the DRA slices go straight into its tracker (they arrive in the initial
// list, not as thousands of watch events), and the jobs wait in eng as
// arrivals.
func newCluster(opts Options, eng *engine, rec *measure.Recorder) (*cluster, error) {
	plan := opts.Plan
	cpu, err := resource.ParseQuantity(plan.Scenario.Cluster.CPU)
	if err != nil {
		return nil, fmt.Errorf("cluster.cpu: %w", err)
	}
	memory, err := resource.ParseQuantity(plan.Scenario.Cluster.Memory)
	if err != nil {
		return nil, fmt.Errorf("cluster.memory: %w", err)
	}
	bg, err := newBackground(plan)
	if err != nil {
		return nil, err
	}
	c := &cluster{
		plan: plan, eng: eng, rec: rec, bg: bg,
		resourceVersion: &atomic.Int64{}, counts: &counters{}, binds: &bindLog{}, deletions: &deletions{},
		nodes: nodeSet{byName: map[string]*nodeSpec{}, pods: map[string]map[string]bool{}, cpu: cpu, memory: memory,
			domains: domainsOf(plan.Nodes)},
		work: workload{podGang: map[string]*gangState{}},
	}
	c.work.bindsApplied = c.binds.reader()
	if n := plan.DRANodes(); n > 0 {
		if opts.Scheduler == None {
			return nil, fmt.Errorf("scheduler %s binds pods itself and allocates no DRA devices; it cannot run a cluster with cluster.dra", None)
		}
		c.dra = newDRACluster(n)
		c.dra.checked = c.binds.reader()
	}
	if opts.Scheduler == None {
		c.work.fit = newFirstFit(plan, bg)
	}

	watch.DefaultChanSize = watchBuffer
	c.cs = fake.NewSimpleClientset()
	c.cs.PrependReactor("create", "pods", c.bindReactor(opts.BindFault))
	c.cs.PrependReactor("delete", "pods", c.deleteReactor)
	if so := plan.Scenario.Soak; so != nil && so.RefuseJobPatches > 0 {
		c.cs.PrependReactor("patch", "jobs", refuseJobPatches(so.RefuseJobPatches, plan.Seed, &c.refusedPatches))
	}
	for _, n := range plan.Nodes {
		spec := &nodeSpec{name: n.Name, rack: n.Rack, zone: n.Zone, gpus: n.GPUs, spot: n.Spot, dra: n.DRA, slot: n.Slot}
		c.nodes.add(spec)
		if n.Spot {
			c.nodes.slots = append(c.nodes.slots, n.Name)
		}
		nodeCPU, nodeMemory := c.nodes.resources(spec.gpus, plan.Scenario.Cluster.GPUsPerNode)
		if err := c.cs.Tracker().Add(versioned(c.resourceVersion, nodeObject(*spec, nodeCPU, nodeMemory))); err != nil {
			return nil, err
		}
	}
	if err := c.addDRA(); err != nil {
		return nil, err
	}
	if err := c.addBackground(); err != nil {
		return nil, err
	}
	// The initial list delivers every node as an add: wait for those too.
	c.counts.wanted[kindNodeAdd].Add(int64(len(plan.Nodes)))

	for i := range plan.Jobs {
		j := &plan.Jobs[i]
		if i == 0 || j.Priority < c.work.lowestPriority {
			c.work.lowestPriority = j.Priority
		}
		g := &gangState{job: j}
		c.work.gangs = append(c.work.gangs, g)
		eng.push(event{at: j.Submit, kind: evArrival, seq: j.Seq, gang: g})
	}
	for i, r := range plan.Reclaims {
		eng.push(event{at: r.At, kind: evNotice, seq: i, reclaim: &plan.Reclaims[i]})
	}
	return c, nil
}

// versioned gives obj the next resourceVersion of counter.
func versioned[T metav1.Object](counter *atomic.Int64, obj T) T {
	obj.SetResourceVersion(strconv.FormatInt(counter.Add(1), 10))
	return obj
}

type nodeSpec struct {
	name, rack, zone string
	gpus             int64
	spot             bool
	// dra: the node's GPUs are DRA devices (scenario.DRA).
	dra        bool
	slot       int
	generation int
}

func (s *nodeSet) add(spec *nodeSpec) {
	s.byName[spec.name] = spec
	s.capacityGPUs += spec.gpus
}

func (s *nodeSet) remove(name string) *nodeSpec {
	spec := s.byName[name]
	delete(s.byName, name)
	delete(s.pods, name)
	s.capacityGPUs -= spec.gpus
	return spec
}

// bind and unbind keep the gangs' pods per node.
func (s *nodeSet) bind(node, pod string) {
	if s.pods[node] == nil {
		s.pods[node] = map[string]bool{}
	}
	s.pods[node][pod] = true
}

func (s *nodeSet) unbind(node, pod string) { delete(s.pods[node], pod) }

// resources is a node's CPU and memory: a full node's for a node of
// gpusPerNode GPUs, in proportion for a smaller one.
func (s *nodeSet) resources(gpus, gpusPerNode int64) (cpu, memory resource.Quantity) {
	if gpus == gpusPerNode {
		return s.cpu, s.memory
	}
	cpu = *resource.NewMilliQuantity(s.cpu.MilliValue()*gpus/gpusPerNode, resource.DecimalSI)
	memory = *resource.NewQuantity(s.memory.Value()*gpus/gpusPerNode, resource.BinarySI)
	return cpu, memory
}

// nodeResources is resources for this cluster's nodes.
func (c *cluster) nodeResources(gpus int64) (cpu, memory resource.Quantity) {
	return c.nodes.resources(gpus, c.plan.Scenario.Cluster.GPUsPerNode)
}

type gangState struct {
	job     *scenario.Job
	jobObj  *batchv1.Job
	attempt int
	pods    []string
	bound   map[string]string // pod → node
	// cpuOnly are the current attempt's CPU-only members.
	cpuOnly map[string]bool
	running bool
	done    bool
	// listed: in workload.live.
	listed bool
}

// arrived lists g among the live gangs (once, however often it restarts).
func (w *workload) arrived(g *gangState) {
	if !g.listed && !g.done {
		g.listed = true
		w.live = append(w.live, g)
	}
}

// liveGangs are the gangs that arrived and are not done.
func (w *workload) liveGangs() []*gangState {
	kept := w.live[:0]
	for _, g := range w.live {
		if g.done {
			g.listed = false
			continue
		}
		kept = append(kept, g)
	}
	clear(w.live[len(kept):])
	w.live = kept
	return kept
}

// heldGPUs are the GPUs of the gang's bound members: every bound member's
// but those of the (few) CPU-only ones.
func (g *gangState) heldGPUs() int64 {
	gpuMembers := len(g.bound)
	for name := range g.cpuOnly {
		if _, bound := g.bound[name]; bound {
			gpuMembers--
		}
	}
	return int64(gpuMembers) * g.job.GPUs
}

// podGPUs are the GPUs member pod asks for.
func (g *gangState) podGPUs(pod string) int64 {
	if g.cpuOnly[pod] {
		return 0
	}
	return g.job.GPUs
}

func (c *cluster) placement(g *gangState) measure.Placement {
	nodes := make([]string, 0, len(g.bound))
	for _, node := range g.bound {
		nodes = append(nodes, node)
	}
	return measure.PlacementOf(nodes, func(n string) string { return c.nodes.byName[n].rack }, func(n string) bool { return c.nodes.byName[n].spot })
}

func (c *cluster) partialGangs() []string {
	var out []string
	for _, g := range c.work.liveGangs() {
		if n := len(g.bound); n > 0 && n < g.job.Members() {
			out = append(out, g.job.Name)
		}
	}
	return out
}

func (c *cluster) sample() measure.Sample {
	s := measure.Sample{T: c.eng.now.Seconds(), CapacityGPUs: c.nodes.capacityGPUs}
	for _, g := range c.work.liveGangs() {
		held := g.heldGPUs()
		s.HeldGPUs += held
		if g.running {
			s.RunningGPUs += held
		}
	}
	return s
}

func (c *cluster) progressState() ProgressState {
	st := ProgressState{Virtual: c.eng.now, Total: len(c.work.gangs), Done: c.work.finished}
	for _, g := range c.work.liveGangs() {
		if g.running {
			st.Running++
		}
	}
	return st
}

// topologyKey is the topology constraint of a job's PodGroup: none but for
// native gang scheduling with TAS.
func (c *cluster) topologyKey(j *scenario.Job) string {
	if !c.b.rackConstraints {
		return ""
	}
	return topologyKeyFor(j, c.nodes.domains)
}
