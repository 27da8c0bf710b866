package controlplane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// GPUResource is the extended resource muster counts by default.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Topology labels used by the default topology levels.
const (
	LabelHostname = "kubernetes.io/hostname"
	LabelRack     = "topology.kubernetes.io/rack"
	LabelZone     = "topology.kubernetes.io/zone"
)

// GPUNode describes a node to create: nothing runs on it, it only has
// capacity and labels.
type GPUNode struct {
	Name   string
	GPUs   int64
	Rack   string
	Zone   string
	Labels map[string]string
	Taints []corev1.Taint
}

// Node builds the Node object: 64 CPUs, 512Gi memory, 110 pods, the GPUs, a
// Ready condition, the hostname label and the rack/zone labels when set.
func (n GPUNode) Node() *corev1.Node {
	labels := map[string]string{LabelHostname: n.Name}
	if n.Rack != "" {
		labels[LabelRack] = n.Rack
	}
	if n.Zone != "" {
		labels[LabelZone] = n.Zone
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		GPUResource:           *resource.NewQuantity(n.GPUs, resource.DecimalSI),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: n.Taints},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

// CreateNodes creates the nodes (with their status) in the API server.
func CreateNodes(ctx context.Context, client kubernetes.Interface, nodes ...GPUNode) error {
	for _, n := range nodes {
		obj := n.Node()
		created, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		created.Status = obj.Status
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting status of node %s: %w", n.Name, err)
		}
	}
	return nil
}

// Cluster returns racks × nodesPerRack nodes of gpus each, named
// r<rack>-n<node>, racks spread round-robin over zones.
func Cluster(racks, nodesPerRack, zones int, gpus int64) []GPUNode {
	var nodes []GPUNode
	for r := 1; r <= racks; r++ {
		for n := 1; n <= nodesPerRack; n++ {
			nodes = append(nodes, GPUNode{
				Name: fmt.Sprintf("r%d-n%d", r, n),
				GPUs: gpus,
				Rack: fmt.Sprintf("r%d", r),
				Zone: fmt.Sprintf("z%d", (r-1)%max(zones, 1)+1),
			})
		}
	}
	return nodes
}
