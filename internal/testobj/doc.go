// Package testobj builds the Kubernetes objects muster's tests, the
// simulator and the demo make: GPU Nodes, worker Pods, Indexed Jobs and
// StatefulSets of workers. It follows upstream kube-scheduler's
// pkg/scheduler/testing wrappers (st.MakePod().Name("p").Req(...).Obj()):
// MakeX starts an object, each method sets one thing and returns the
// wrapper, Obj returns the object.
//
//	node := testobj.MakeNode("r1-n1").GPUs(8).Rack("r1").Zone("z1").Ready().Obj()
//	job := testobj.MakeJob("team-a", "mnist").Indexed().Workers(4).BackoffLimit(0).
//		PodSpec(testobj.WorkerPodSpec("muster", 8)).Obj()
//
// Unlike upstream's, MakeX takes the object's identity (namespace, name),
// which every object here has. A wrapper sets only what its methods say:
// MakePod and MakeJob start from empty specs, MakeNode from the capacity of
// a GPU machine. The resource and label names come from muster's node
// vocabulary in pkg/apis/config/v1.
//
// It is test support, not an API; the simulator (cmd/muster-sim) uses it to
// build its simulated cluster.
package testobj
