package tfconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// TFConfigForPod returns the value the kubelet gives the environment variable TF_CONFIG of the named
// container (or init container) of pod, computed with the kubelet's own $(VAR) expansion code and the
// same order of evaluation: envFrom first, then env in declaration order, each literal value expanded
// against the variables defined before it. secretData is the data of the Secret the container refers
// to (the Job's <job>-tf-config); every secretKeyRef and envFrom secretRef resolves against it.
//
// It simulates what TF_CONFIG needs, not all of the kubelet: service link variables are left out, and
// ConfigMaps, resource fields and files are errors unless marked optional. Like the kubelet, it fails
// on a missing non-optional Secret key and leaves an unresolved $(VAR) as it is.
func TFConfigForPod(pod *corev1.Pod, container string, secretData map[string][]byte) (string, error) {
	c := findContainer(pod, container)
	if c == nil {
		return "", fmt.Errorf("pod %s/%s has no container %q", pod.Namespace, pod.Name, container)
	}
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.SecretRef != nil:
			for k, v := range secretData {
				env[from.Prefix+k] = string(v)
			}
		case from.ConfigMapRef != nil:
			if from.ConfigMapRef.Optional == nil || !*from.ConfigMapRef.Optional {
				return "", fmt.Errorf("container %q: envFrom ConfigMap %q cannot be resolved offline", container, from.ConfigMapRef.Name)
			}
		}
	}
	mapping := expansion.MappingFuncFor(env)
	for _, v := range c.Env {
		value := v.Value
		switch {
		case value != "":
			value = expansion.Expand(value, mapping)
		case v.ValueFrom == nil:
		case v.ValueFrom.FieldRef != nil:
			var err error
			if value, err = podFieldValue(pod, v.ValueFrom.FieldRef.FieldPath); err != nil {
				return "", fmt.Errorf("container %q: env %s: %w", container, v.Name, err)
			}
		case v.ValueFrom.SecretKeyRef != nil:
			ref := v.ValueFrom.SecretKeyRef
			data, ok := secretData[ref.Key]
			if !ok {
				if ref.Optional != nil && *ref.Optional {
					continue
				}
				return "", fmt.Errorf("container %q: env %s: couldn't find key %s in Secret %s/%s", container, v.Name, ref.Key, pod.Namespace, ref.Name)
			}
			value = string(data)
		default:
			if optionalSource(v.ValueFrom) {
				continue
			}
			return "", fmt.Errorf("container %q: env %s: only fieldRef and secretKeyRef sources can be resolved offline", container, v.Name)
		}
		env[v.Name] = value
	}
	tfConfig, ok := env["TF_CONFIG"]
	if !ok {
		return "", fmt.Errorf("container %q does not set TF_CONFIG", container)
	}
	return tfConfig, nil
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	return nil
}

func optionalSource(s *corev1.EnvVarSource) bool {
	switch {
	case s.ConfigMapKeyRef != nil:
		return s.ConfigMapKeyRef.Optional != nil && *s.ConfigMapKeyRef.Optional
	case s.FileKeyRef != nil:
		return s.FileKeyRef.Optional != nil && *s.FileKeyRef.Optional
	}
	return false
}

// podFieldValue resolves the downward-API field paths a TF_CONFIG can use, as the kubelet does
// (a missing label or annotation is the empty string).
func podFieldValue(pod *corev1.Pod, path string) (string, error) {
	for prefix, m := range map[string]map[string]string{
		"metadata.annotations": pod.Annotations,
		"metadata.labels":      pod.Labels,
	} {
		if rest, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m[key], nil
			}
		}
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	}
	return "", fmt.Errorf("field path %q is not simulated", path)
}

// ValidateTFConfig checks a TF_CONFIG value against the rules TensorFlow applies when a distribution
// strategy reads it (TFConfigClusterResolver and multi_worker_util): valid JSON; cluster keys among
// chief, worker, ps and evaluator, at most one chief and one evaluator; every address host:port with a
// DNS host and a port in range; a task whose type is a valid role and whose index is a non-negative
// integer below the number of tasks of that type (an evaluator may be absent from the cluster).
func ValidateTFConfig(tfConfig string) error {
	var cfg struct {
		Cluster map[string][]string `json:"cluster"`
		Task    *struct {
			Type  string          `json:"type"`
			Index json.RawMessage `json:"index"`
		} `json:"task"`
	}
	dec := json.NewDecoder(strings.NewReader(tfConfig))
	if err := dec.Decode(&cfg); err != nil {
		return fmt.Errorf("TF_CONFIG is not a JSON object of the expected shape (an unexpanded $(VAR)?): %w", err)
	}
	if dec.More() {
		return fmt.Errorf("TF_CONFIG has trailing data after the JSON object")
	}
	for key, addrs := range cfg.Cluster {
		if _, err := ParseRole(key); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		if (key == string(RoleChief) || key == string(RoleEvaluator)) && len(addrs) > 1 {
			return fmt.Errorf("cluster: %d %s tasks, TensorFlow allows one", len(addrs), key)
		}
		for _, a := range addrs {
			if err := validateAddress(a); err != nil {
				return fmt.Errorf("cluster %s: %w", key, err)
			}
		}
	}
	if cfg.Task == nil {
		if len(cfg.Cluster) > 0 {
			return fmt.Errorf("TF_CONFIG has a cluster but no task")
		}
		return nil
	}
	role, err := ParseRole(cfg.Task.Type)
	if err != nil {
		return fmt.Errorf("task type: %w", err)
	}
	// TensorFlow reads the index with int(), so "1" works as well as 1.
	raw := bytes.Trim(cfg.Task.Index, `"`)
	index, err := strconv.Atoi(string(raw))
	if err != nil || index < 0 {
		return fmt.Errorf("task index %s is not a non-negative integer", cfg.Task.Index)
	}
	tasks, listed := cfg.Cluster[string(role)]
	if !listed && role == RoleEvaluator {
		return nil
	}
	if index >= len(tasks) {
		return fmt.Errorf("task %s %d is out of range: the cluster has %d %s tasks", role, index, len(tasks), role)
	}
	return nil
}

func validateAddress(addr string) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q is not host:port: %w", addr, err)
	}
	if port, err := strconv.Atoi(portStr); err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("address %q: port out of range", addr)
	}
	if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
		return fmt.Errorf("address %q: host is not a DNS name: %s", addr, strings.Join(errs, "; "))
	}
	return nil
}
