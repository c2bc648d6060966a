package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// backendDescription is what `backend describe` shows: the backend as
// stored, what the mesh sees of it (its replicas one by one), and the
// endpoints that send it requests, as -o json and yaml give it too.
type backendDescription struct {
	Backend meshspec.Backend   `json:"backend"`
	Status  *api.BackendStatus `json:"status,omitempty"`
	UsedBy  []backendUse       `json:"used_by,omitempty"`
	// now is when it was read: the replicas' ages are to it.
	now time.Time
}

// backendUse is one endpoint's use of a backend: its weight in the split,
// the proportion mirrored to it.
type backendUse struct {
	Endpoint string  `json:"endpoint"`
	Model    string  `json:"model,omitempty"`
	Weight   float64 `json:"weight,omitempty"`
	Shadow   float64 `json:"shadow,omitempty"`
}

// describedReplica is one replica's row.
type describedReplica struct {
	name, node, address, state, ready, restarts, age, note string
}

func newBackendDescribeCommand(f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:               "describe NAME",
		Short:             "show a backend in full: its config, its replicas one by one (address, node, health, restarts, age) and the endpoints that use it",
		Example:           "  servemesh backend describe model-v1\n  servemesh backend describe model-v1 -o yaml",
		Args:              names(1, "one backend name"),
		ValidArgsFunction: completeKind("backend", f),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			b, err := c.GetBackend(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			status, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			endpoints, err := c.ListEndpoints(cmd.Context())
			if err != nil {
				return err
			}
			d := describeBackend(b, status, endpoints, time.Now())
			if done, err := f.structured(cmd.OutOrStdout(), d); done {
				return err
			}
			return d.write(cmd.OutOrStdout())
		},
	}
}

// describeBackend joins a backend with the status report and the
// endpoints that use it, at now (replicas' ages).
func describeBackend(b meshspec.Backend, status api.StatusReport, endpoints []meshspec.Endpoint, now time.Time) backendDescription {
	d := backendDescription{Backend: b, now: now}
	if i := slices.IndexFunc(status.Backends, func(s api.BackendStatus) bool { return s.Name == b.Name }); i >= 0 {
		d.Status = &status.Backends[i]
	}
	for _, e := range endpoints {
		d.UsedBy = append(d.UsedBy, usesOf(e, b.Name)...)
	}
	return d
}

// usesOf is how e uses backend: in its split, its shadows, or a model's.
func usesOf(e meshspec.Endpoint, backend string) []backendUse {
	policies := map[string]meshspec.TrafficPolicy{"": {Traffic: e.Traffic, Shadows: e.Shadows}}
	if e.ModelRouting != nil {
		policies = e.ModelRouting.Models
	}
	var out []backendUse
	for _, model := range meshspec.SortedKeys(policies) {
		p := policies[model]
		w, inSplit := p.Traffic[backend]
		s, shadowed := p.Shadows[backend]
		if inSplit || shadowed {
			out = append(out, backendUse{Endpoint: e.Name, Model: model, Weight: w, Shadow: s})
		}
	}
	return out
}

// replicas are the backend's replicas as rows: a process backend's
// placements with what its agents report, or its listed or Consul
// service's replicas.
func (d backendDescription) replicas() []describedReplica {
	if d.Status != nil && len(d.Status.Replicas) > 0 {
		out := make([]describedReplica, 0, len(d.Status.Replicas))
		for _, r := range d.Status.Replicas {
			ready := "no"
			switch {
			case r.Ready:
				ready = "yes"
			case r.Unheard:
				ready = "unheard"
			}
			state := string(r.State)
			if r.InFlight != nil {
				state += fmt.Sprintf(" (%d in flight)", *r.InFlight)
			}
			out = append(out, describedReplica{name: r.Tag, node: r.Node, address: orNone(r.Address), state: state,
				ready: ready, restarts: fmt.Sprint(r.Restarts), age: age(r.Since, d.now), note: orNone(firstLine(r.Note))})
		}
		return out
	}
	out := make([]describedReplica, 0, len(d.Backend.Replicas))
	for i, r := range d.Backend.Replicas {
		health := string(r.Health)
		if health == "" {
			health = "healthy"
		}
		out = append(out, describedReplica{name: fmt.Sprintf("%s[%d]", d.Backend.Name, i), node: orNone(r.Node), address: r.Address,
			state: "listed", ready: health, restarts: "-", age: "-", note: "-"})
	}
	return out
}

// write renders the description as kubectl describe does: fields, then
// the replicas' table, then the endpoints that use the backend.
func (d backendDescription) write(out io.Writer) error {
	b := d.Backend
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	source, _, _ := replicaSource(b)
	fmt.Fprintf(tw, "Name:\t%s\n", b.Name)
	fmt.Fprintf(tw, "Replicas from:\t%s\n", source)
	if b.Process != nil {
		fmt.Fprintf(tw, "Command:\t%s\n", strings.Join(append([]string{b.Process.Command}, b.Process.Args...), " "))
	}
	fmt.Fprintf(tw, "Protocol:\t%s\n", orNone(string(b.Protocol)))
	if s := d.Status; s != nil {
		fmt.Fprintf(tw, "Replicas:\t%d desired, %d running, %d ready, %d draining", s.Desired, s.Running, s.Ready, s.Draining)
		if s.Unheard > 0 {
			fmt.Fprintf(tw, ", %d unheard", s.Unheard)
		}
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "Load:\t%.1f req/s, %.1f err/s, %.1f in flight, %.1f held\n", s.RequestRate, s.ErrorRate, s.InFlight, s.Held)
	}
	autoscale := "-"
	if as := b.Config.Autoscaling; as != nil {
		autoscale = fmt.Sprintf("%d to %d replicas, %g requests in flight each", as.MinReplicas, as.MaxReplicas, as.TargetInFlight)
	}
	fmt.Fprintf(tw, "Autoscaling:\t%s\n", autoscale)
	fmt.Fprintf(tw, "Config:\tmax_concurrent_queries %d, cpus %g, memory_mb %d\n", b.Config.EffectiveMaxConcurrentQueries(), b.Config.CPUs, b.Config.MemoryMB)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nReplicas:")
	if err := writeTable(indent(out), "NAME\tNODE\tADDRESS\tSTATE\tREADY\tRESTARTS\tAGE\tNOTE", d.replicas(), func(r describedReplica) string {
		return strings.Join([]string{r.name, r.node, r.address, r.state, r.ready, r.restarts, r.age, r.note}, "\t")
	}); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nUsed by:")
	if len(d.UsedBy) == 0 {
		_, err := fmt.Fprintln(out, "  no endpoint: it gets no requests")
		return err
	}
	return writeTable(indent(out), "ENDPOINT\tMODEL\tWEIGHT\tSHADOW", d.UsedBy, func(u backendUse) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s", u.Endpoint, orNone(u.Model), share(u.Weight), share(u.Shadow))
	})
}

// share is a weight or proportion, "-" for none.
func share(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%g", x)
}

// age is how long ago since (Unix seconds) was, as kubectl shows ages:
// "45s", "12m", "3h", "2d"; "-" unknown.
func age(since int64, now time.Time) string {
	if since <= 0 {
		return "-"
	}
	d := now.Sub(time.Unix(since, 0))
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// firstLine is s up to its first line break.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// indent writes what is written to it two spaces in, line by line.
func indent(out io.Writer) io.Writer { return &indented{out: out, start: true} }

type indented struct {
	out   io.Writer
	start bool
}

func (w *indented) Write(p []byte) (int, error) {
	var b strings.Builder
	for _, c := range string(p) {
		if w.start {
			b.WriteString("  ")
		}
		b.WriteRune(c)
		w.start = c == '\n'
	}
	if _, err := io.WriteString(w.out, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}
