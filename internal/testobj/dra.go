package testobj

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// The GPUs of dynamic resource allocation (DRA) in muster's tests: one
// driver, whose DeviceClass of the same name also serves the GPU extended
// resource (nvidia.com/gpu), so a pod's `limits: nvidia.com/gpu: 8` is
// allocated 8 devices on a node that publishes them in a ResourceSlice
// instead of advertising the resource in its allocatable.
const (
	// GPUDriver is the DRA driver of the GPUs.
	GPUDriver = "gpu.nvidia.com"
	// GPUDeviceClassName is the DeviceClass of the driver's GPUs.
	GPUDeviceClassName = "gpu.nvidia.com"
	// GPURequestName is the request of the claims and templates built here.
	GPURequestName = "gpu"
)

// GPUDeviceClass is the DeviceClass GPUDeviceClassName: every device of
// GPUDriver, and the extended resource nvidia.com/gpu backed by them.
func GPUDeviceClass() *resourcev1.DeviceClass {
	return &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: GPUDeviceClassName},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == %q", GPUDriver),
			}}},
			ExtendedResourceName: ptr.To(string(configv1.DefaultGPUResourceName)),
		},
	}
}

// ResourceSliceWrapper builds the ResourceSlice GPUDriver's kubelet plugin
// publishes for one node.
type ResourceSliceWrapper struct{ resourcev1.ResourceSlice }

// MakeGPUSlice starts the ResourceSlice of node's GPUs, as the driver
// publishes it: driver GPUDriver, pool named after the node (generation 1,
// one slice), spec.nodeName the node, and gpus devices gpu-0..gpu-<gpus-1>.
func MakeGPUSlice(node string, gpus int) *ResourceSliceWrapper {
	s := &ResourceSliceWrapper{resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + GPUDriver},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   GPUDriver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}}
	for i := range gpus {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i)})
	}
	return s
}

// Obj returns the ResourceSlice.
func (s *ResourceSliceWrapper) Obj() *resourcev1.ResourceSlice { return &s.ResourceSlice }

// GPUSlice is MakeGPUSlice(node, gpus).Obj().
func GPUSlice(node string, gpus int) *resourcev1.ResourceSlice { return MakeGPUSlice(node, gpus).Obj() }

// GPUClaimSpec asks for exactly gpus devices of GPUDeviceClassName in one
// request, GPURequestName.
func GPUClaimSpec(gpus int64) resourcev1.ResourceClaimSpec {
	return resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
		Name: GPURequestName,
		Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: GPUDeviceClassName,
			AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
			Count:           gpus,
		},
	}}}}
}

// GPUClaim is ResourceClaim namespace/name asking for gpus GPUs
// (GPUClaimSpec).
func GPUClaim(namespace, name string, gpus int64) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       GPUClaimSpec(gpus),
	}
}

// GPUClaimTemplate is ResourceClaimTemplate namespace/name whose claims ask
// for gpus GPUs (GPUClaimSpec).
func GPUClaimTemplate(namespace, name string, gpus int64) *resourcev1.ResourceClaimTemplate {
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: GPUClaimSpec(gpus)},
	}
}

// ClaimFromPodSpec adds pod claim name, ResourceClaim claim, to spec and
// lets every container of spec use it: set the containers first.
func ClaimFromPodSpec(spec *corev1.PodSpec, name, claim string) {
	addPodClaim(spec, corev1.PodResourceClaim{Name: name, ResourceClaimName: ptr.To(claim)})
}

// ClaimTemplateFromPodSpec adds pod claim name, made from
// ResourceClaimTemplate template for each pod, to spec and lets every
// container of spec use it: set the containers first.
func ClaimTemplateFromPodSpec(spec *corev1.PodSpec, name, template string) {
	addPodClaim(spec, corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(template)})
}

func addPodClaim(spec *corev1.PodSpec, claim corev1.PodResourceClaim) {
	spec.ResourceClaims = append(spec.ResourceClaims, claim)
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: claim.Name})
	}
}

// ResourceClaim makes ResourceClaim claim the pod's claim name, used by
// every container the pod has so far.
func (p *PodWrapper) ResourceClaim(name, claim string) *PodWrapper {
	ClaimFromPodSpec(&p.Spec, name, claim)
	return p
}

// ResourceClaim makes ResourceClaim claim the pods' claim name (all pods
// share it), used by every container of the template so far.
func (t podTemplate[W]) ResourceClaim(name, claim string) W {
	ClaimFromPodSpec(&t.tmpl.Spec, name, claim)
	return t.self
}

// ResourceClaimTemplate gives each pod its own claim name made from
// ResourceClaimTemplate template, used by every container of the template so
// far.
func (t podTemplate[W]) ResourceClaimTemplate(name, template string) W {
	ClaimTemplateFromPodSpec(&t.tmpl.Spec, name, template)
	return t.self
}

// DRAWorkerPodSpec is WorkerPodSpec without the GPU resource: one container
// "worker" of the TensorFlow image asking for one CPU, whose GPUs come from
// a ResourceClaim added with ResourceClaim or ResourceClaimTemplate.
func DRAWorkerPodSpec(scheduler string) corev1.PodSpec {
	worker := MakeContainer("worker").Image(WorkerImage).Request(corev1.ResourceCPU, resource.MustParse("1"))
	return corev1.PodSpec{
		SchedulerName: scheduler,
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{worker.Obj()},
	}
}

// NoGPUResource drops the GPU extended resource from the node's capacity
// and allocatable: a node whose GPUs are served by DRA (a ResourceSlice,
// GPUSlice) and not by the device plugin.
func (n *NodeWrapper) NoGPUResource() *NodeWrapper {
	delete(n.Status.Capacity, configv1.DefaultGPUResourceName)
	delete(n.Status.Allocatable, configv1.DefaultGPUResourceName)
	return n
}
