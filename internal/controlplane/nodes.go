package controlplane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateNodes creates the nodes (built with internal/testobj) with their
// status in the API server: nothing runs on them, they only have capacity,
// labels and conditions.
func CreateNodes(ctx context.Context, client kubernetes.Interface, nodes ...*corev1.Node) error {
	for _, obj := range nodes {
		created, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", obj.Name, err)
		}
		created.Status = obj.Status
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting status of node %s: %w", obj.Name, err)
		}
	}
	return nil
}
