package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// rolloutFlags are what `rollout start` turns into a meshspec.Rollout.
type rolloutFlags struct {
	candidate, steps, header string
	shadow                   float64
	duration                 time.Duration
	minRequests              int
	checks                   meshspec.RolloutChecks
	maxLatency               time.Duration
	scaleDown                bool
}

func (r *rolloutFlags) register(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&r.candidate, "candidate", "", "the backend to roll out (required)")
	fs.StringVar(&r.steps, "steps", "0.05,0.25,0.5,1", "the candidate's share of the requests at each traffic step, increasing, up to 1")
	fs.DurationVar(&r.duration, "step-duration", time.Minute, "how long each stage lasts at least")
	fs.IntVar(&r.minRequests, "step-min-requests", 100, "how many answers of the candidate each stage needs at least")
	fs.Float64Var(&r.shadow, "shadow", 0, "first mirror this proportion of the requests to the candidate, judged but unseen by users (0: no shadow stage)")
	fs.StringVar(&r.header, "header", "", "then send only requests with this header value to the candidate (NAME=VALUE; none: no header stage)")
	fs.Float64Var(&r.checks.MaxErrorRate, "max-error-rate", 0, "fail when more than this share of the candidate's answers are errors (default 0.01)")
	fs.Float64Var(&r.checks.MaxErrorRateIncrease, "max-error-rate-increase", 0, "also fail when its error rate is this much above the primary's (default: no such check)")
	fs.Float64Var(&r.checks.LatencyPercentile, "latency-percentile", 0, "the latency percentile compared (default 99)")
	fs.DurationVar(&r.maxLatency, "max-latency", 0, "fail when the candidate's percentile is above this (default: no bound)")
	fs.Float64Var(&r.checks.MaxLatencyRatio, "max-latency-ratio", 0, "fail when the candidate's percentile is more than this many times the primary's (default 2)")
	fs.IntVar(&r.checks.MinSample, "min-sample", 0, "answers of the candidate needed before any verdict (default 20)")
	fs.BoolVar(&r.scaleDown, "scale-down-primary", false, "scale the primary to 0 replicas once the candidate is promoted")
}

// rollout builds the rollout the flags describe.
func (r *rolloutFlags) rollout() (meshspec.Rollout, error) {
	if r.candidate == "" {
		return meshspec.Rollout{}, fmt.Errorf("--candidate: name the backend to roll out")
	}
	out := meshspec.Rollout{Candidate: r.candidate, Checks: r.checks, ScaleDownPrimary: r.scaleDown}
	out.Checks.MaxLatencyMs = float64(r.maxLatency) / float64(time.Millisecond)
	durationS := r.duration.Seconds()
	for _, s := range strings.Split(r.steps, ",") {
		w, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return meshspec.Rollout{}, fmt.Errorf("--steps: %q is not a number; give increasing shares such as 0.05,0.25,1", s)
		}
		out.Steps = append(out.Steps, meshspec.RolloutStep{Weight: w, DurationS: durationS, MinRequests: r.minRequests})
	}
	if r.shadow > 0 {
		out.Shadow = &meshspec.RolloutShadow{Proportion: r.shadow, DurationS: durationS, MinRequests: r.minRequests}
	}
	if r.header != "" {
		name, value, ok := strings.Cut(r.header, "=")
		if !ok {
			return meshspec.Rollout{}, fmt.Errorf("--header: %q is not NAME=VALUE, such as x-canary=1", r.header)
		}
		out.Header = &meshspec.RolloutHeader{Header: name, Value: value, DurationS: durationS, MinRequests: r.minRequests}
	}
	return out, nil
}

func newRolloutCommand() *cobra.Command {
	var f clientFlags
	verbs := append([]*cobra.Command{newRolloutStartCommand(&f), newRolloutStatusCommand(&f)}, rolloutActionCommands(&f)...)
	return nounCommand("rollout", "roll a backend out on an endpoint in stages judged by live figures", &f, verbs...)
}

func newRolloutStartCommand(f *clientFlags) *cobra.Command {
	var rf rolloutFlags
	start := &cobra.Command{
		Use:               "start ENDPOINT --candidate BACKEND",
		ValidArgsFunction: completeName(f, endpointNames),
		Short:             "roll a backend out on an endpoint in stages, each judged by live figures; a failed check rolls it back",
		Example: "  servemesh rollout start model --candidate model-v3-candidate --shadow 0.5 --steps 0.05,0.25,1 --step-duration 2m\n" +
			"  servemesh rollout start model --candidate model-v3-candidate --header x-canary=1 --max-latency 300ms\n" +
			"  servemesh rollout status model -w      # follow it until Ctrl-C",
		Args: names(1, "one endpoint name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := rf.rollout()
			if err != nil {
				return err
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			before, err := c.GetEndpoint(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			changed, err := c.StartRollout(cmd.Context(), args[0], r)
			if err == nil && changed {
				if share, ok := before.Shadows[r.Candidate]; ok {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: endpoint %s mirrored %g of its requests to %s; the rollout decides the candidate's shadow now, "+
						"and leaves none when it ends (shadow set puts one back)\n", args[0], share, r.Candidate)
				}
			}
			return report(cmd, "endpoint", args[0], changed, err, "rollout of "+r.Candidate+" started", "already runs this rollout")
		},
	}
	rf.register(start)
	return start
}

func newRolloutStatusCommand(f *clientFlags) *cobra.Command {
	var watching watchFlags
	status := &cobra.Command{
		Use:               "status ENDPOINT",
		ValidArgsFunction: completeName(f, endpointNames),
		Short:             "show a rollout's stage, its live figures next to the thresholds, and its verdicts (-w to follow it)",
		Args:              names(1, "one endpoint name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			return watching.run(cmd, func(out io.Writer) error {
				r, err := c.Rollout(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if done, err := f.structured(out, r); done {
					return err
				}
				return printRollout(out, r)
			})
		},
	}
	watching.register(status.Flags())
	return status
}

// rolloutActionCommands are pause, resume, promote and abort.
func rolloutActionCommands(f *clientFlags) []*cobra.Command {
	var verbs []*cobra.Command
	for _, a := range []struct {
		action    meshspec.RolloutAction
		short     string
		did, same string
	}{
		{meshspec.PauseRollout, "hold a rollout at its stage; nothing is judged", "rollout paused", "rollout is not progressing"},
		{meshspec.ResumeRollout, "judge a paused rollout's stage again, from the start of its window", "rollout resumed", "rollout is not paused"},
		{meshspec.PromoteRollout, "give the candidate all the traffic now", "rollout promoted", "rollout promoted already"},
		{meshspec.AbortRollout, "give the primary all the traffic now and end the rollout", "rollout aborted", "rollout ended already"},
	} {
		verbs = append(verbs, &cobra.Command{
			Use:               string(a.action) + " ENDPOINT",
			ValidArgsFunction: completeName(f, endpointNames),
			Short:             a.short,
			Args:              names(1, "one endpoint name"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := f.client(cmd)
				if err != nil {
					return err
				}
				changed, err := c.ActOnRollout(cmd.Context(), args[0], a.action)
				return report(cmd, "endpoint", args[0], changed, err, a.did, a.same)
			},
		})
	}
	return verbs
}

// printRollout renders a rollout report.
// rolloutHeadline says what a rollout does, or did once it ended.
func rolloutHeadline(r api.RolloutReport) string {
	switch r.Phase {
	case meshspec.RolloutPromoted:
		return fmt.Sprintf("rolled %s out: it has every request; %s has none", r.Candidate, r.Primary)
	case meshspec.RolloutRolledBack:
		return fmt.Sprintf("rollout of %s ended; every request is back on %s", r.Candidate, r.Primary)
	}
	return fmt.Sprintf("rolling out %s over %s", r.Candidate, r.Primary)
}

// phaseMeaning says what each phase means for the endpoint's requests.
var phaseMeaning = map[meshspec.RolloutPhase]string{
	meshspec.RolloutWaiting:     "waiting: the candidate has no ready replica yet, so every request stays on the primary and no stage is judged; the first stage begins once one is ready",
	meshspec.RolloutProgressing: "progressing: the current stage (▶) is judged on its live figures",
	meshspec.RolloutPaused:      "paused: the current stage holds and is not judged; servemesh rollout resume judges it again",
	meshspec.RolloutRolledBack:  "rolled back: a check failed, or the rollout was aborted; servemesh rollout start begins another",
}

func printRollout(out io.Writer, r api.RolloutReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "endpoint %s: %s\n", r.Endpoint, rolloutHeadline(r))
	fmt.Fprintf(tw, "phase %s since %s", r.Phase, time.UnixMilli(r.SinceMs).UTC().Format(time.RFC3339))
	if r.Reason != "" {
		fmt.Fprintf(tw, ": %s", r.Reason)
	}
	fmt.Fprintln(tw)
	if what := phaseMeaning[r.Phase]; what != "" {
		fmt.Fprintf(tw, "(%s)\n", what)
	}
	fmt.Fprintln(tw, "\nSTAGE\t")
	for i, s := range r.Stages {
		mark := " "
		switch {
		case i < len(r.Verdicts) && r.Verdicts[i].Passed:
			mark = "✓"
		case i < len(r.Verdicts):
			mark = "✗"
		case i == r.StageIndex && (r.Phase == meshspec.RolloutProgressing || r.Phase == meshspec.RolloutPaused):
			mark = "▶" // waiting has no stage begun yet
		}
		fmt.Fprintf(tw, "%s %s\t\n", mark, s)
	}
	c := r.Checks
	fmt.Fprintln(tw, "\nFIGURES\tCANDIDATE\tPRIMARY\tTHRESHOLD")
	if l := r.Live; l != nil {
		fmt.Fprintf(tw, "answers (%s, %.0fs)\t%d\t%d\tat least %d before a verdict\n", l.Stage, l.WindowS, l.Candidate.Requests, l.Primary.Requests, c.MinSample)
		fmt.Fprintf(tw, "error rate\t%.2f%%\t%.2f%%\t%s\n", 100*l.Candidate.ErrorRate, 100*l.Primary.ErrorRate, errorThreshold(c))
		fmt.Fprintf(tw, "p%g latency\t%.1f ms\t%.1f ms\t%s\n", c.LatencyPercentile, l.Candidate.LatencyMs, l.Primary.LatencyMs, latencyThreshold(c))
	} else {
		fmt.Fprintf(tw, "(no stage being judged)\t\t\terror rate %s; latency %s\n", errorThreshold(c), latencyThreshold(c))
	}
	if len(r.Verdicts) > 0 {
		fmt.Fprintln(tw, "\nVERDICT\tSTAGE\tAT\tCANDIDATE ANSWERS/ERRORS/LATENCY\tPRIMARY\tREASON")
		for _, v := range r.Verdicts {
			result := "passed"
			if !v.Passed {
				result = "failed"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", result, v.Stage, time.UnixMilli(v.AtMs).UTC().Format(time.TimeOnly),
				figures(v.Candidate), figures(v.Primary), v.Reason)
		}
	}
	return tw.Flush()
}

func figures(f meshspec.RolloutFigures) string {
	return fmt.Sprintf("%d/%d/%.1fms", f.Requests, f.Errors, f.LatencyMs)
}

func errorThreshold(c meshspec.RolloutChecks) string {
	s := fmt.Sprintf("≤ %.2f%%", 100*c.MaxErrorRate)
	if c.MaxErrorRateIncrease > 0 {
		s += fmt.Sprintf(", ≤ primary + %.2f points", 100*c.MaxErrorRateIncrease)
	}
	return s
}

func latencyThreshold(c meshspec.RolloutChecks) string {
	s := fmt.Sprintf("≤ %g × primary (or within %g ms of it)", c.MaxLatencyRatio, c.LatencyToleranceMs)
	if c.MaxLatencyMs > 0 {
		s += fmt.Sprintf(", ≤ %g ms", c.MaxLatencyMs)
	}
	return s
}
