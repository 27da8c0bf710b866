package testobj

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// WorkerImage is the TensorFlow image of the workers tests and the
// simulator create. Nothing pulls it: no kubelet runs.
const WorkerImage = "tensorflow/tensorflow:2.15.0-gpu"

// ContainerWrapper builds a Container.
type ContainerWrapper struct{ corev1.Container }

// MakeContainer starts a container named name.
func MakeContainer(name string) *ContainerWrapper {
	return &ContainerWrapper{corev1.Container{Name: name}}
}

// Obj returns the Container.
func (c *ContainerWrapper) Obj() corev1.Container { return c.Container }

// Image sets the image.
func (c *ContainerWrapper) Image(image string) *ContainerWrapper { c.Container.Image = image; return c }

// Request sets the request of resource name.
func (c *ContainerWrapper) Request(name corev1.ResourceName, q resource.Quantity) *ContainerWrapper {
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{}
	}
	c.Resources.Requests[name] = q
	return c
}

// GPUs sets the request and the limit of the GPU resource (an extended
// resource's request must equal its limit).
func (c *ContainerWrapper) GPUs(gpus int64) *ContainerWrapper {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	if c.Resources.Limits == nil {
		c.Resources.Limits = corev1.ResourceList{}
	}
	c.Resources.Limits[configv1.DefaultGPUResourceName] = q
	return c.Request(configv1.DefaultGPUResourceName, q)
}

// Ports sets the container's ports (none when called without).
func (c *ContainerWrapper) Ports(ports ...corev1.ContainerPort) *ContainerWrapper {
	c.Container.Ports = ports
	return c
}

// WorkerPodSpec is the training worker of the integration tests, for
// scheduler and never restarted: one container "worker" of the TensorFlow
// image asking for one CPU and gpus GPUs.
func WorkerPodSpec(scheduler string, gpus int64) corev1.PodSpec {
	worker := MakeContainer("worker").Image(WorkerImage).Request(corev1.ResourceCPU, resource.MustParse("1")).GPUs(gpus)
	return corev1.PodSpec{
		SchedulerName: scheduler,
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{worker.Obj()},
	}
}

// OnePerNode is the usual MultiWorkerMirroredStrategy anti-affinity: at
// most one pod with these labels per node (required, on the hostname).
func OnePerNode(labels map[string]string) *corev1.Affinity {
	return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
			TopologyKey:   configv1.LabelHostname,
		}},
	}}
}
