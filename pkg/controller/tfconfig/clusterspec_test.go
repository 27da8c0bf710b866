package tfconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestBuildClusterSpec(t *testing.T) {
	worker := func(job string, n int32) TaskSet {
		return TaskSet{Role: RoleWorker, JobName: job, Subdomain: job, Port: 2222, Replicas: n}
	}
	tests := []struct {
		name      string
		namespace string
		sets      []TaskSet
		want      string
	}{
		{
			name:      "one worker",
			namespace: "ns",
			sets:      []TaskSet{worker("mnist", 1)},
			want:      `{"worker":["mnist-0.mnist.ns.svc:2222"]}`,
		},
		{
			name:      "three workers, subdomain and port of their own",
			namespace: "team-a",
			sets:      []TaskSet{{Role: RoleWorker, JobName: "mnist", Subdomain: "tf", Port: 3333, Replicas: 3}},
			want:      `{"worker":["mnist-0.tf.team-a.svc:3333","mnist-1.tf.team-a.svc:3333","mnist-2.tf.team-a.svc:3333"]}`,
		},
		{
			name:      "parameter-server group: keys sorted whatever the input order, evaluator left out",
			namespace: "ns",
			sets: []TaskSet{
				worker("w", 2),
				{Role: RoleEvaluator, JobName: "e", Replicas: 1},
				{Role: RolePS, JobName: "p", Subdomain: "p", Port: 2223, Replicas: 2},
				{Role: RoleChief, JobName: "c", Subdomain: "c", Port: 2222, Replicas: 1},
			},
			want: `{"chief":["c-0.c.ns.svc:2222"],"ps":["p-0.p.ns.svc:2223","p-1.p.ns.svc:2223"],"worker":["w-0.w.ns.svc:2222","w-1.w.ns.svc:2222"]}`,
		},
		{
			name:      "chief alone",
			namespace: "ns",
			sets:      []TaskSet{{Role: RoleChief, JobName: "c", Subdomain: "c", Port: 1, Replicas: 1}},
			want:      `{"chief":["c-0.c.ns.svc:1"]}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BuildClusterSpec(tc.namespace, tc.sets)
			if err != nil {
				t.Fatalf("BuildClusterSpec: %v", err)
			}
			if string(got) != tc.want {
				t.Errorf("cluster spec\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestBuildClusterSpecErrors(t *testing.T) {
	ok := TaskSet{Role: RoleWorker, JobName: "mnist", Subdomain: "mnist", Port: 2222, Replicas: 2}
	with := func(f func(*TaskSet)) []TaskSet {
		s := ok
		f(&s)
		return []TaskSet{s}
	}
	tests := []struct {
		name       string
		namespace  string
		sets       []TaskSet
		wantReason string
		wantInMsg  string
	}{
		{"no task sets", "ns", nil, ReasonInvalidGroup, "no Jobs"},
		{"bad namespace", "Team_A", []TaskSet{ok}, ReasonInvalidName, "namespace"},
		{"unknown role", "ns", with(func(s *TaskSet) { s.Role = "master" }), ReasonInvalidRole, "chief, worker, ps, evaluator"},
		{"zero replicas", "ns", with(func(s *TaskSet) { s.Replicas = 0 }), ReasonInvalidReplicas, "at least 1"},
		{"two chiefs", "ns", with(func(s *TaskSet) { s.Role = RoleChief }), ReasonInvalidReplicas, "allows one chief"},
		// 61 characters + "-10" is 64, one over the DNS label limit.
		{"hostname too long", "ns", with(func(s *TaskSet) { s.JobName = strings.Repeat("a", 61); s.Replicas = 11 }), ReasonInvalidName, "shorter Job name"},
		{"job name with a dot", "ns", with(func(s *TaskSet) { s.JobName = "a.b" }), ReasonInvalidName, "not a DNS label"},
		{"no subdomain", "ns", with(func(s *TaskSet) { s.Subdomain = "" }), ReasonMissingSubdomain, "spec.template.spec.subdomain"},
		{"subdomain starting with a digit", "ns", with(func(s *TaskSet) { s.Subdomain = "1tf" }), ReasonInvalidName, "Service name"},
		{"port zero", "ns", with(func(s *TaskSet) { s.Port = 0 }), ReasonInvalidPort, "1 to 65535"},
		{"port too big", "ns", with(func(s *TaskSet) { s.Port = 70000 }), ReasonInvalidPort, "1 to 65535"},
		{"two worker Jobs", "ns", []TaskSet{ok, {Role: RoleWorker, JobName: "other", Subdomain: "o", Port: 1, Replicas: 1}}, ReasonInvalidGroup, "both have role worker"},
		{"ps only", "ns", with(func(s *TaskSet) { s.Role = RolePS }), ReasonInvalidGroup, "no chief or worker"},
		{"evaluator only", "ns", []TaskSet{{Role: RoleEvaluator, JobName: "e", Replicas: 1}}, ReasonInvalidGroup, "no chief or worker"},
		// "x-0.x.ns.svc:2222" is 19 bytes with quotes and comma: 10,000 of them exceed the limit.
		{"too many tasks", "ns", []TaskSet{{Role: RoleWorker, JobName: "x", Subdomain: "x", Port: 2222, Replicas: 10000}}, ReasonClusterTooLarge, "128 KiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BuildClusterSpec(tc.namespace, tc.sets)
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("BuildClusterSpec = %q, %v; want an *InvalidError", got, err)
			}
			if ie.Reason != tc.wantReason || !strings.Contains(ie.Message, tc.wantInMsg) {
				t.Errorf("error = %s: %q; want reason %s and a message containing %q", ie.Reason, ie.Message, tc.wantReason, tc.wantInMsg)
			}
		})
	}
}

func TestBuildClusterSpecLargestAccepted(t *testing.T) {
	// 64 tasks with maximal names still fit in the limit, and every host is a valid DNS name.
	job := strings.Repeat("j", 60) // "<60 j>-63" is a 63-character label
	sub := strings.Repeat("s", 63)
	ns := strings.Repeat("n", 63)
	got, err := BuildClusterSpec(ns, []TaskSet{{Role: RoleWorker, JobName: job, Subdomain: sub, Port: 65535, Replicas: 64}})
	if err != nil {
		t.Fatalf("BuildClusterSpec: %v", err)
	}
	checkClusterSpec(t, ns, []TaskSet{{Role: RoleWorker, JobName: job, Subdomain: sub, Port: 65535, Replicas: 64}}, got)
}

// checkClusterSpec verifies a spec the builder accepted: JSON, only cluster roles, the naming scheme
// for every task, hosts that are DNS names, and the size limit.
func checkClusterSpec(t *testing.T, namespace string, sets []TaskSet, got []byte) {
	t.Helper()
	if len(got) > MaxClusterSpecBytes {
		t.Errorf("spec is %d bytes, over MaxClusterSpecBytes", len(got))
	}
	var cluster map[string][]string
	if err := json.Unmarshal(got, &cluster); err != nil {
		t.Fatalf("spec %q is not a JSON object of lists: %v", got, err)
	}
	want := map[string]TaskSet{}
	for _, s := range sets {
		if s.Role.inCluster() {
			want[string(s.Role)] = s
		}
	}
	if len(cluster) != len(want) {
		t.Errorf("spec has roles %v, want those of %v", keys(cluster), keys(want))
	}
	for role, addrs := range cluster {
		s, ok := want[role]
		if !ok {
			t.Errorf("spec has role %q, which is not a cluster role of the input", role)
			continue
		}
		if len(addrs) != int(s.Replicas) {
			t.Errorf("role %s has %d tasks, want %d", role, len(addrs), s.Replicas)
		}
		for i, a := range addrs {
			if w := fmt.Sprintf("%s-%d.%s.%s.svc:%d", s.JobName, i, s.Subdomain, namespace, s.Port); a != w {
				t.Errorf("role %s task %d is %q, want %q", role, i, a, w)
			}
			host, port, err := net.SplitHostPort(a)
			if err != nil {
				t.Errorf("address %q: %v", a, err)
				continue
			}
			if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				t.Errorf("address %q: bad port", a)
			}
			if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
				t.Errorf("host %q is not a DNS name: %v", host, errs)
			}
			for _, label := range strings.Split(host, ".") {
				if errs := validation.IsDNS1123Label(label); len(errs) > 0 {
					t.Errorf("host %q: label %q is not a DNS label: %v", host, label, errs)
				}
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// FuzzBuildClusterSpec: for any input the builder either returns a spec that passes
// checkClusterSpec (and the same bytes again on a second call), or an *InvalidError with a reason
// and a message. The seeds run with plain go test; go test -fuzz=FuzzBuildClusterSpec explores.
func FuzzBuildClusterSpec(f *testing.F) {
	type seed struct {
		ns                string
		role1, job1, sub1 string
		port1, n1         int32
		role2, job2, sub2 string
		port2, n2         int32
		two               bool
	}
	for _, s := range []seed{
		{"ns", "worker", "mnist", "mnist", 2222, 4, "", "", "", 0, 0, false},
		{"team-a", "worker", "w", "tf", 1, 1, "ps", "p", "tf", 65535, 3, true},
		{"ns", "chief", "c", "c", 2222, 1, "worker", "w", "w", 2222, 64, true},
		{"ns", "evaluator", "e", "", 0, 1, "worker", "w", "w", 2222, 2, true},
		{"ns", "worker", strings.Repeat("a", 61), "s", 2222, 11, "", "", "", 0, 0, false},
		{"ns", "worker", "x", "x", 2222, 1 << 30, "", "", "", 0, 0, false},
		{"NS", "master", "a.b", "1s", -1, -5, "worker", "a.b", "", 0, 0, true},
		{"ns", "worker", "w", "w", 2222, 2, "worker", "w", "w", 2222, 2, true},
		{"", "", "", "", 0, 0, "", "", "", 0, 0, false},
	} {
		f.Add(s.ns, s.role1, s.job1, s.sub1, s.port1, s.n1, s.role2, s.job2, s.sub2, s.port2, s.n2, s.two)
	}
	reasons := map[string]bool{
		ReasonInvalidGroup: true, ReasonInvalidName: true, ReasonInvalidRole: true, ReasonInvalidReplicas: true,
		ReasonMissingSubdomain: true, ReasonInvalidPort: true, ReasonClusterTooLarge: true,
	}
	f.Fuzz(func(t *testing.T, ns, role1, job1, sub1 string, port1, n1 int32, role2, job2, sub2 string, port2, n2 int32, two bool) {
		sets := []TaskSet{{Role: Role(role1), JobName: job1, Subdomain: sub1, Port: port1, Replicas: n1}}
		if two {
			sets = append(sets, TaskSet{Role: Role(role2), JobName: job2, Subdomain: sub2, Port: port2, Replicas: n2})
		}
		got, err := BuildClusterSpec(ns, sets)
		if err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) || !reasons[ie.Reason] || ie.Message == "" {
				t.Fatalf("error %#v is not an *InvalidError with a known reason and a message", err)
			}
			return
		}
		checkClusterSpec(t, ns, sets, got)
		again, err := BuildClusterSpec(ns, sets)
		if err != nil || string(again) != string(got) {
			t.Fatalf("second call gave %q, %v; want the same bytes %q", again, err, got)
		}
	})
}
