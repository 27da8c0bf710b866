package tfconfig

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/internal/testobj"
)

// makeJob is an opted-in Indexed Job of n tasks with subdomain name and a tfjob-port 2222, shaped as
// the API server would store it (uid, generation, resourceVersion, template labels defaulted).
func makeJob(namespace, name string, n int32) *testobj.JobWrapper {
	uid := fmt.Sprintf("uid-%s-%s", namespace, name)
	return testobj.MakeJob(namespace, name).TypeMeta().UID(uid).Generation(1).ResourceVersion("1").
		Label(OptInLabel, "true").Indexed().Workers(n).
		PodLabel(batchv1.JobNameLabel, name).PodLabel(batchv1.ControllerUidLabel, uid).
		Subdomain(name).RestartPolicy(corev1.RestartPolicyNever).Container(tfContainer())
}

// makeSet is an opted-in Parallel StatefulSet of n replicas with serviceName name, selecting its pods
// by app=name, with a tfjob-port 2222.
func makeSet(namespace, name string, n int32) *testobj.StatefulSetWrapper {
	return testobj.MakeStatefulSet(namespace, name).TypeMeta().UID(fmt.Sprintf("uid-sts-%s-%s", namespace, name)).
		Generation(1).ResourceVersion("1").Label(OptInLabel, "true").
		Replicas(n).ServiceName(name).PodManagementPolicy(appsv1.ParallelPodManagement).
		SelectPods(map[string]string{"app": name}).Container(tfContainer())
}

// tfContainer is the TensorFlow container of makeJob and makeSet.
func tfContainer() corev1.Container {
	return testobj.MakeContainer("tensorflow").Image("tf").Ports(tfjobPort(2222, corev1.ProtocolTCP)).Obj()
}

// tfjobPort is the container port named tfjob-port.
func tfjobPort(port int32, protocol corev1.Protocol) corev1.ContainerPort {
	return corev1.ContainerPort{Name: PortName, ContainerPort: port, Protocol: protocol}
}

// addrs returns the JSON list of the addresses of n tasks named <name>-<i> under service svc.
func addrs(ns, name, svc string, n int, port int) string {
	s := ""
	for i := range n {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(`"%s-%d.%s.%s.svc:%d"`, name, i, svc, ns, port)
	}
	return "[" + s + "]"
}

// workers returns the worker list of an N-task Job named job with subdomain job in namespace ns.
func workers(ns, job string, n int, port int) string { return addrs(ns, job, job, n, port) }

func makeSecret(namespace, name string, data string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-secret-" + name), ResourceVersion: "1"},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{ClusterKey: []byte(data)},
	}
}

func makeService(namespace, name string, headless bool, selector map[string]string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-svc-" + name), ResourceVersion: "1"},
		Spec:       corev1.ServiceSpec{Selector: selector, ClusterIP: "10.0.0.1"},
	}
	if headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	return svc
}
