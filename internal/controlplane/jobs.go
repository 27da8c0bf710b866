package controlplane

import (
	"context"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// WorkerPodSpec is a training worker that asks scheduler for gpus GPUs and
// one CPU. Nothing runs it: nodes here have no kubelet.
func WorkerPodSpec(scheduler string, gpus int64) corev1.PodSpec {
	gpu := *resource.NewQuantity(gpus, resource.DecimalSI)
	return corev1.PodSpec{
		SchedulerName: scheduler,
		RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{
			Name:  "worker",
			Image: "tensorflow/tensorflow:2.15.0-gpu",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), GPUResource: gpu},
				Limits:   corev1.ResourceList{GPUResource: gpu},
			},
		}},
	}
}

// GPUJob is an Indexed Job of workers such workers, all running at once
// (parallelism = completions) and not retried: muster's zero-config gang.
func GPUJob(namespace, name string, workers int32, gpus int64, scheduler string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To(workers),
			Completions:    ptr.To(workers),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			BackoffLimit:   ptr.To[int32](0),
			Template:       corev1.PodTemplateSpec{Spec: WorkerPodSpec(scheduler, gpus)},
		},
	}
}

// DeleteJob deletes a Job and its pods now. No garbage collector runs in the
// in-process control plane, so the pods are deleted here as it would.
func DeleteJob(ctx context.Context, client kubernetes.Interface, namespace, name string) error {
	err := client.BatchV1().Jobs(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil {
		return err
	}
	return client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
}
