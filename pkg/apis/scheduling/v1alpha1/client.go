package v1alpha1

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// Client is a typed PodGroup client over a dynamic client, so no generated
// clientset is needed.
// +k8s:deepcopy-gen=false
type Client struct {
	dyn dynamic.Interface
}

// NewClient wraps a dynamic client.
func NewClient(dyn dynamic.Interface) *Client { return &Client{dyn: dyn} }

// FromUnstructured converts an object of a dynamic informer or client.
func FromUnstructured(obj interface{}) (*PodGroup, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("expected *unstructured.Unstructured, got %T", obj)
	}
	pg := &PodGroup{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pg); err != nil {
		return nil, fmt.Errorf("decoding PodGroup %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return pg, nil
}

func toUnstructured(pg *PodGroup) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pg)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(SchemeGroupVersion.String())
	u.SetKind("PodGroup")
	return u, nil
}

// Get reads one PodGroup.
func (c *Client) Get(ctx context.Context, namespace, name string) (*PodGroup, error) {
	u, err := c.dyn.Resource(Resource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return FromUnstructured(u)
}

// Create creates a PodGroup.
func (c *Client) Create(ctx context.Context, pg *PodGroup) (*PodGroup, error) {
	return c.send(pg, func(r dynamic.ResourceInterface, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return r.Create(ctx, u, metav1.CreateOptions{})
	})
}

// UpdateStatus writes the status subresource.
func (c *Client) UpdateStatus(ctx context.Context, pg *PodGroup) (*PodGroup, error) {
	return c.send(pg, func(r dynamic.ResourceInterface, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return r.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	})
}

// send converts pg, hands it to write on pg's namespace and decodes the
// PodGroup the API server answers with.
func (c *Client) send(pg *PodGroup, write func(dynamic.ResourceInterface, *unstructured.Unstructured) (*unstructured.Unstructured, error)) (*PodGroup, error) {
	u, err := toUnstructured(pg)
	if err != nil {
		return nil, err
	}
	out, err := write(c.dyn.Resource(Resource).Namespace(pg.Namespace), u)
	if err != nil {
		return nil, err
	}
	return FromUnstructured(out)
}

// Patch applies a patch of type pt to a PodGroup.
func (c *Client) Patch(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
	_, err := c.dyn.Resource(Resource).Namespace(namespace).Patch(ctx, name, pt, data, opts)
	return err
}
