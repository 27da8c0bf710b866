package kubectlmuster

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// APIVersion versions the -o json|yaml documents.
const APIVersion = "muster.dev/v1alpha1"

// GangList is `kubectl muster gangs -o json`.
type GangList struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Items      []Gang `json:"items"`
}

// ExplanationDocument is `kubectl muster explain -o json`.
type ExplanationDocument struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	*Explanation
}

// TopDocument is `kubectl muster top -o json`.
type TopDocument struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Cluster    Domain `json:"cluster"`
}

// printDocument writes doc as JSON or YAML.
func printDocument(out io.Writer, format string, doc any) error {
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", data)
	return err
}

// printGangs writes the gangs table (wide adds priority, nodes and muster's
// message).
func printGangs(out io.Writer, gangs []Gang, allNamespaces, wide bool, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	header := []string{"GANG", "MEMBERS", "PHASE", "GPUS", "DOMAIN", "AGE"}
	if allNamespaces {
		header = append([]string{"NAMESPACE"}, header...)
	}
	if wide {
		header = append(header, "PRIORITY", "NODES", "REASON", "MESSAGE")
	}
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, g := range gangs {
		row := []string{g.Ref(), fmt.Sprintf("%d/%d", g.Bound, g.Quorum), string(g.Phase), fmt.Sprint(g.GPUs), orDefault(g.Domain, "-"), age(now, g.Since)}
		if allNamespaces {
			row = append([]string{g.Namespace}, row...)
		}
		if wide {
			row = append(row, fmt.Sprint(g.Priority), orDefault(strings.Join(g.Nodes, ","), "-"), orDefault(g.Reason, "-"), oneLine(g.Message))
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	return w.Flush()
}

// oneLine keeps a message to one table cell.
func oneLine(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Join(strings.Fields(s), " ")
}

// printExplanation writes an explanation for people.
func printExplanation(out io.Writer, ex *Explanation, gpu string, now time.Time) error {
	g := ex.Gang
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "Gang:\t%s in namespace %s\n", g.Ref(), g.Namespace)
	since := ""
	if g.Since != nil {
		since = fmt.Sprintf(" for %s (since %s)", age(now, g.Since), g.Since.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "Phase:\t%s%s\n", g.Phase, since)
	fmt.Fprintf(w, "Members:\t%d/%d bound (%d exist, %d gated); %d %s; priority %d\n", g.Bound, g.Quorum, g.Members, g.Gated, g.GPUs, gpu, g.Priority)
	fmt.Fprintf(w, "Asks for:\t%s\n", asksFor(ex.Constraints))
	if g.Domain != "" {
		fmt.Fprintf(w, "Domain:\t%s\n", g.Domain)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(ex.Findings) > 0 {
		fmt.Fprintln(out, "\nWhy, and what would make it fit:")
		for _, f := range ex.Findings {
			fmt.Fprintf(out, "  - %s: %s\n", f.Reason, f.Message)
		}
	}
	if len(ex.Nodes) > 0 {
		fmt.Fprintln(out, "\nNodes, by the first reason each cannot take a member:")
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  NODES\tREASON\tWHY\tFOR EXAMPLE")
		for _, n := range ex.Nodes {
			fmt.Fprintf(w, "  %d\t%s\t%s\t%s\n", n.Nodes, n.Reason, n.Message, strings.Join(n.Examples, ", "))
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if f := ex.LastFailedPlan; f != nil && len(f.Nodes) > 0 {
		fmt.Fprintf(out, "\nNodes at the scheduler's last failed plan (%s ago):\n", age(now, &metav1.Time{Time: f.Time}))
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  NODES\tREASON")
		for _, n := range f.Nodes {
			reason := n.Reason
			if n.Filter != "" {
				reason += " (" + n.Filter + ")"
			}
			fmt.Fprintf(w, "  %d\t%s\n", n.Nodes, reason)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if len(ex.Members) > 0 {
		fmt.Fprintln(out, "\nMembers:")
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  NAME\tNODE\tDOMAIN\tGPUS\tSTATE")
		for _, m := range ex.Members {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%s\n", m.Name, orDefault(m.Node, "-"), orDefault(m.Domain, "-"), m.GPUs, m.state())
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if len(ex.Events) > 0 {
		fmt.Fprintln(out, "\nmuster's Events (newest first):")
		for _, e := range ex.Events {
			fmt.Fprintf(out, "  %s ago\t%s (x%d): %s\n", age(now, e.Last), e.Reason, e.Count, oneLine(e.Message))
		}
	}
	return nil
}

// asksFor lists what the gang's members ask of their placement.
func asksFor(c Constraints) string {
	wants := []string{"preemptible " + c.Preemptible}
	if c.TopologyRequired != "" {
		wants = append(wants, "topology-required "+c.TopologyRequired)
	}
	if c.TopologyPreferred != "" {
		wants = append(wants, "topology-preferred "+c.TopologyPreferred)
	}
	if c.PreemptionPolicy != "" {
		wants = append(wants, "preemptionPolicy "+c.PreemptionPolicy)
	}
	return strings.Join(wants, ", ")
}

// state is the member's column in explain's Members table.
func (m MemberState) state() string {
	switch {
	case m.Node != "":
		return "bound"
	case len(m.Gates) > 0:
		return "gated (" + strings.Join(m.Gates, ",") + ")"
	case m.Nominated != "":
		return "nominated to " + m.Nominated
	}
	return "pending"
}

// printTop writes the domain tree, nodes included when wide.
func printTop(out io.Writer, root Domain, wide bool) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "DOMAIN\tNODES\tGPUS\tHELD\tFREE\tFREE SPOT\tFREE ON-DEMAND\tUNAVAILABLE\tFITS %d-GPU WORKERS\n", root.WorkerGPUs)
	var walk func(d Domain, depth int)
	walk = func(d Domain, depth int) {
		if d.Level == "node" && !wide {
			return
		}
		name := d.Name
		if d.Level != "cluster" {
			name = d.Level + " " + d.Name
		}
		fmt.Fprintf(w, "%s%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", strings.Repeat("  ", depth), name, d.Nodes, d.GPUs, d.Held, d.Free, d.FreeSpot, d.FreeOnDemand, d.Unavailable, d.LargestGang)
		for _, c := range d.Children {
			walk(c, depth+1)
		}
	}
	walk(root, 0)
	return w.Flush()
}
