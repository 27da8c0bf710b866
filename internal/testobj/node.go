package testobj

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// NodeWrapper builds a Node.
type NodeWrapper struct {
	corev1.Node
	objectMeta[*NodeWrapper]
}

// MakeNode starts node name as its kubelet would register a GPU machine of
// muster's tests: the hostname label, and a capacity (the same list is the
// allocatable) of 64 CPUs, 512Gi memory, 110 pods and 0 GPUs. Nothing runs
// on it; no condition is set until Ready.
func MakeNode(name string) *NodeWrapper {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("64"),
		corev1.ResourceMemory:           resource.MustParse("512Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		configv1.DefaultGPUResourceName: *resource.NewQuantity(0, resource.DecimalSI),
	}
	n := &NodeWrapper{Node: corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{configv1.LabelHostname: name}},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}}
	n.objectMeta = newObjectMeta(n, &n.ObjectMeta)
	return n
}

// Obj returns the Node.
func (n *NodeWrapper) Obj() *corev1.Node { return &n.Node }

// Rack sets the rack label (the default preset's rack level).
func (n *NodeWrapper) Rack(rack string) *NodeWrapper { return n.Label(configv1.LabelRack, rack) }

// Zone sets the zone label.
func (n *NodeWrapper) Zone(zone string) *NodeWrapper { return n.Label(configv1.LabelZone, zone) }

// Spot labels the node a GKE spot node, preemptible by the default matchers.
func (n *NodeWrapper) Spot() *NodeWrapper { return n.Label(configv1.LabelGKESpot, "true") }

// GPUs sets the node's capacity of the GPU resource.
func (n *NodeWrapper) GPUs(gpus int64) *NodeWrapper {
	return n.capacity(configv1.DefaultGPUResourceName, *resource.NewQuantity(gpus, resource.DecimalSI))
}

// CPU sets the node's CPU capacity.
func (n *NodeWrapper) CPU(q resource.Quantity) *NodeWrapper { return n.capacity(corev1.ResourceCPU, q) }

// Memory sets the node's memory capacity.
func (n *NodeWrapper) Memory(q resource.Quantity) *NodeWrapper {
	return n.capacity(corev1.ResourceMemory, q)
}

func (n *NodeWrapper) capacity(name corev1.ResourceName, q resource.Quantity) *NodeWrapper {
	n.Status.Capacity[name] = q
	n.Status.Allocatable[name] = q
	return n
}

// Taint adds a taint.
func (n *NodeWrapper) Taint(t corev1.Taint) *NodeWrapper {
	n.Spec.Taints = append(n.Spec.Taints, t)
	return n
}

// Ready sets the node's one condition: Ready.
func (n *NodeWrapper) Ready() *NodeWrapper {
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	return n
}

// Cluster is racks × nodesPerRack Ready nodes of gpus GPUs each, named
// r<rack>-n<node>, in racks r<rack> spread round-robin over zones z<zone>.
func Cluster(racks, nodesPerRack, zones int, gpus int64) []*corev1.Node {
	var nodes []*corev1.Node
	for r := 1; r <= racks; r++ {
		for n := 1; n <= nodesPerRack; n++ {
			nodes = append(nodes, MakeNode(fmt.Sprintf("r%d-n%d", r, n)).GPUs(gpus).
				Rack(fmt.Sprintf("r%d", r)).Zone(fmt.Sprintf("z%d", (r-1)%max(zones, 1)+1)).Ready().Obj())
		}
	}
	return nodes
}
