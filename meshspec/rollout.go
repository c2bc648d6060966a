package meshspec

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
)

// Rollout moves an endpoint from its primary backend to a candidate in
// stages, each judged by the live figures of both backends, as Flagger and
// Argo Rollouts do from outside a mesh: an optional shadow stage (the
// candidate gets mirrored copies; nothing a user sees depends on it), an
// optional header stage (only requests that carry a header go to it), then
// traffic steps. A stage passes when it has lasted its duration and the
// candidate has answered its minimum of requests within the checks; a
// failed check sends all traffic back to the primary at once. A passed
// rollout ends with the candidate at 100%.
//
// What users write is the spec (every field but Status); the controller
// keeps Status, and with it sets the endpoint's traffic, shadows and match
// rules for the stage (ApplyRollout): while a rollout is active, those of
// the candidate are its own.
type Rollout struct {
	// Candidate is the backend rolled out; the primary is the backend
	// that has all of the endpoint's traffic when the rollout starts.
	Candidate string         `json:"candidate"`
	Shadow    *RolloutShadow `json:"shadow,omitempty"`
	Header    *RolloutHeader `json:"header,omitempty"`
	Steps     []RolloutStep  `json:"steps"`
	Checks    RolloutChecks  `json:"checks,omitempty"`
	// ScaleDownPrimary sets the primary's num_replicas to 0 at promotion
	// (a process backend without autoscaling).
	ScaleDownPrimary bool `json:"scale_down_primary,omitempty"`
	// Status is the controller's record of the rollout; users do not set it.
	Status *RolloutStatus `json:"status,omitempty"`
}

// RolloutShadow is the shadow stage: Proportion of the endpoint's requests
// are mirrored to the candidate, whose answers are judged and discarded.
type RolloutShadow struct {
	// Proportion of the endpoint's requests is mirrored, from 0 to 1.
	Proportion float64 `json:"proportion"`
	// DurationS is how long the stage lasts, in seconds, before it is
	// judged; MinRequests how many answers of the candidate it needs first
	// (it waits for them).
	DurationS   float64 `json:"duration_s"`
	MinRequests int     `json:"min_requests,omitempty"`
}

// RolloutHeader is the header stage: requests whose Header is Value go to
// the candidate, the others to the primary.
type RolloutHeader struct {
	// Header is the request header, Value what it must be.
	Header string `json:"header"`
	Value  string `json:"value"`
	// DurationS is how long the stage lasts, in seconds, before it is
	// judged; MinRequests how many answers of the candidate it needs first
	// (it waits for them).
	DurationS   float64 `json:"duration_s"`
	MinRequests int     `json:"min_requests,omitempty"`
}

// RolloutStep is a traffic step: Weight of the endpoint's requests go to
// the candidate.
type RolloutStep struct {
	// Weight is the candidate's share of the requests, from 0 to 1.
	Weight float64 `json:"weight"`
	// DurationS is how long the stage lasts, in seconds, before it is
	// judged; MinRequests how many answers of the candidate it needs first
	// (it waits for them).
	DurationS   float64 `json:"duration_s"`
	MinRequests int     `json:"min_requests,omitempty"`
}

// RolloutChecks are the thresholds every stage is judged by, comparing the
// candidate's figures over the stage with the primary's over the same
// window. Zero fields take the defaults.
type RolloutChecks struct {
	// MaxErrorRate fails the candidate when more than this share of its
	// answers are errors (5xx, which is also how Envoy counts a request
	// whose connection was reset or timed out before an answer, and gRPC
	// calls that ended with a status other than OK); 0.01 by default.
	MaxErrorRate float64 `json:"max_error_rate,omitempty"`
	// MaxErrorRateIncrease, if set, also fails it when its error rate
	// exceeds the primary's by more than this (0.005: half a point).
	MaxErrorRateIncrease float64 `json:"max_error_rate_increase,omitempty"`
	// LatencyPercentile is the percentile of the answers' time compared:
	// 99 by default. A window with too few answers for it is judged at a
	// lower one (the rollout package's judgedPercentile).
	LatencyPercentile float64 `json:"latency_percentile,omitempty"`
	// MaxLatencyMs, if set, fails the candidate when its percentile is
	// above it.
	MaxLatencyMs float64 `json:"max_latency_ms,omitempty"`
	// MaxLatencyRatio fails the candidate when its percentile is more than
	// this many times the primary's (2 by default), unless the two differ
	// by at most LatencyToleranceMs (5 ms by default).
	MaxLatencyRatio    float64 `json:"max_latency_ratio,omitempty"`
	LatencyToleranceMs float64 `json:"latency_tolerance_ms,omitempty"`
	// MaxTTFTRatio, if set, fails a candidate of model traffic whose time
	// to first token, at p95, is more than this many times the
	// primary's; MaxInterTokenRatio the same for the mean time between
	// the tokens of its streamed answers. Both read the GenAI signals the
	// calling nodes keep (an endpoint that serves model traffic), once
	// each side has MinSample such answers.
	MaxTTFTRatio       float64 `json:"max_ttft_ratio,omitempty"`
	MaxInterTokenRatio float64 `json:"max_inter_token_ratio,omitempty"`
	// MinSample is how many of the candidate's answers a stage needs
	// before any verdict, and the primary's before it is compared with: 20
	// by default. A stage passes only with its own min_requests too.
	MinSample int `json:"min_sample,omitempty"`
}

// Defaults of RolloutChecks.
const (
	DefaultRolloutMaxErrorRate       = 0.01
	DefaultRolloutLatencyPercentile  = 99
	DefaultRolloutMaxLatencyRatio    = 2
	DefaultRolloutLatencyToleranceMs = 5
	DefaultRolloutMinSample          = 20
)

// Effective returns the checks with defaults filled in.
func (c RolloutChecks) Effective() RolloutChecks {
	orDefault(&c.MaxErrorRate, DefaultRolloutMaxErrorRate)
	orDefault(&c.LatencyPercentile, DefaultRolloutLatencyPercentile)
	orDefault(&c.MaxLatencyRatio, DefaultRolloutMaxLatencyRatio)
	orDefault(&c.LatencyToleranceMs, DefaultRolloutLatencyToleranceMs)
	orDefault(&c.MinSample, DefaultRolloutMinSample)
	return c
}

// Relative reports whether the checks compare the candidate with the
// primary (an error rate increase, a latency ratio), which needs the
// primary's figures.
func (c RolloutChecks) Relative() bool {
	return c.MaxErrorRateIncrease > 0 || c.MaxLatencyRatio > 0 || c.MaxTTFTRatio > 0 || c.MaxInterTokenRatio > 0
}

// TokenPercentile is the percentile the GenAI checks compare
// (MaxTTFTRatio, MaxInterTokenRatio).
const TokenPercentile = 95

// RolloutPhase is where a rollout is.
type RolloutPhase string

// The phases of a rollout.
const (
	// RolloutWaiting: the candidate has no ready replica yet; all traffic
	// stays on the primary.
	RolloutWaiting RolloutPhase = "waiting"
	// RolloutProgressing: the current stage is being judged.
	RolloutProgressing RolloutPhase = "progressing"
	// RolloutPaused: the current stage holds and is not judged.
	RolloutPaused RolloutPhase = "paused"
	// RolloutPromoted: the candidate has all the traffic.
	RolloutPromoted RolloutPhase = "promoted"
	// RolloutRolledBack: a check failed, or a user aborted; the primary has
	// all the traffic.
	RolloutRolledBack RolloutPhase = "rolled_back"
)

// Active reports whether the phase still moves traffic.
func (p RolloutPhase) Active() bool {
	return p == RolloutWaiting || p == RolloutProgressing || p == RolloutPaused
}

// RolloutStatus is the checkpointed record of a rollout: a stage moves on
// in the same commit that records its verdict, so a controller that
// crashes and the one that takes over never judge a stage twice.
type RolloutStatus struct {
	// Primary is the backend the rollout moves from.
	Primary string `json:"primary"`
	// Phase is where the rollout is: waiting, progressing, paused,
	// promoted or rolled_back.
	Phase RolloutPhase `json:"phase"`
	// Stage is the index of the current stage in Rollout.Stages().
	Stage int `json:"stage"`
	// SinceMs is when the stage (or the phase) began, Unix milliseconds.
	SinceMs int64 `json:"since_ms"`
	// Reason says why the rollout ended (the failed check, or who aborted).
	Reason   string           `json:"reason,omitempty"`
	Verdicts []RolloutVerdict `json:"verdicts,omitempty"`
}

// MaxRolloutVerdicts bounds a rollout's recorded verdicts: one a stage.
const MaxRolloutVerdicts = MaxRolloutSteps + 2

// RolloutVerdict is the judgement of one stage, with the figures it was
// taken on.
type RolloutVerdict struct {
	// Stage names the stage judged ("traffic 5%").
	Stage string `json:"stage"`
	// Passed is the verdict, Reason why, AtMs when (Unix milliseconds).
	Passed bool   `json:"passed"`
	AtMs   int64  `json:"at_ms"`
	Reason string `json:"reason"`
	// Candidate and Primary are the figures it was taken on.
	Candidate RolloutFigures `json:"candidate"`
	Primary   RolloutFigures `json:"primary"`
}

// RolloutFigures are one backend's figures over a stage's window.
type RolloutFigures struct {
	// Requests are the answers counted, Errors those that were errors,
	// ErrorRate their share.
	Requests  uint64  `json:"requests"`
	Errors    uint64  `json:"errors"`
	ErrorRate float64 `json:"error_rate"`
	// LatencyMs is the checks' percentile of the answers' time; 0 when
	// there were none to measure.
	LatencyMs float64 `json:"latency_ms"`
	// TTFTMs and InterTokenMs are, for model traffic, the p95 of the time
	// to first token and of the mean time between tokens (TokenPercentile);
	// 0 when there were none to measure.
	TTFTMs       float64 `json:"ttft_p95_ms,omitempty"`
	InterTokenMs float64 `json:"inter_token_p95_ms,omitempty"`
}

// StageKind is what a stage sends the candidate.
type StageKind string

// The kinds of stage.
const (
	StageShadow  StageKind = "shadow"
	StageHeader  StageKind = "header"
	StageTraffic StageKind = "traffic"
)

// RolloutStage is one stage of a rollout, in the order they run.
type RolloutStage struct {
	Kind StageKind
	// Share is the shadow's proportion or the step's weight.
	Share         float64
	Header, Value string
	DurationS     float64
	MinRequests   int
}

// Name says what the stage does: "shadow 50%", "header x-canary=1",
// "traffic 5%".
func (s RolloutStage) Name() string {
	if s.Kind == StageHeader {
		return "header " + s.Header + "=" + s.Value
	}
	return string(s.Kind) + " " + strconv.FormatFloat(s.Share*100, 'f', -1, 64) + "%"
}

// Stages lists the rollout's stages in order.
func (r Rollout) Stages() []RolloutStage {
	var out []RolloutStage
	if s := r.Shadow; s != nil {
		out = append(out, RolloutStage{Kind: StageShadow, Share: s.Proportion, DurationS: s.DurationS, MinRequests: s.MinRequests})
	}
	if h := r.Header; h != nil {
		out = append(out, RolloutStage{Kind: StageHeader, Header: h.Header, Value: h.Value, DurationS: h.DurationS, MinRequests: h.MinRequests})
	}
	for _, s := range r.Steps {
		out = append(out, RolloutStage{Kind: StageTraffic, Share: s.Weight, DurationS: s.DurationS, MinRequests: s.MinRequests})
	}
	return out
}

// Spec returns the rollout without its status: what a user declares.
func (r Rollout) Spec() Rollout {
	r.Status = nil
	return r
}

// SameSpec reports whether two rollouts declare the same thing.
func (r Rollout) SameSpec(o Rollout) bool {
	return reflect.DeepEqual(cloneRollout(r.Spec()), cloneRollout(o.Spec()))
}

// Active reports whether the rollout still moves the endpoint's traffic.
func (r *Rollout) Active() bool { return r != nil && r.Status != nil && r.Status.Phase.Active() }

// ApplyRollout sets the endpoint's traffic, shadows and match rules for its
// rollout's phase and stage. An endpoint without a started rollout is left
// as it is.
func ApplyRollout(e *Endpoint) {
	r := e.Rollout
	if r == nil || r.Status == nil {
		return
	}
	p, c := r.Status.Primary, r.Candidate
	delete(e.Shadows, c)
	e.Match = slices.DeleteFunc(slices.Clone(e.Match), func(m RequestMatch) bool { return m.Backend == c })
	switch r.Status.Phase {
	case RolloutPromoted:
		e.Traffic = map[string]float64{c: 1}
		return
	case RolloutWaiting, RolloutRolledBack:
		e.Traffic = map[string]float64{p: 1}
		return
	}
	stages := r.Stages()
	if r.Status.Stage < 0 || r.Status.Stage >= len(stages) {
		return // Validate refuses it
	}
	s := stages[r.Status.Stage]
	e.Traffic = map[string]float64{p: 1}
	switch s.Kind {
	case StageShadow:
		if e.Shadows == nil {
			e.Shadows = map[string]float64{}
		}
		e.Shadows[c] = s.Share
	case StageHeader:
		e.Match = append([]RequestMatch{{Header: s.Header, Exact: s.Value, Backend: c, MeshOnly: true}}, e.Match...)
	case StageTraffic:
		e.Traffic = map[string]float64{c: s.Share}
		if s.Share < 1 {
			e.Traffic[p] = 1 - s.Share
		}
	}
}

// RolloutAction is what a user asks of a started rollout.
type RolloutAction string

// The actions on a rollout.
const (
	// PauseRollout holds the current stage; nothing is judged.
	PauseRollout RolloutAction = "pause"
	// ResumeRollout judges the current stage again, from the start of its
	// window.
	ResumeRollout RolloutAction = "resume"
	// PromoteRollout gives the candidate all the traffic now.
	PromoteRollout RolloutAction = "promote"
	// AbortRollout gives the primary all the traffic now.
	AbortRollout RolloutAction = "abort"
)

// RolloutActions lists the actions, for help and errors.
var RolloutActions = []RolloutAction{PauseRollout, ResumeRollout, PromoteRollout, AbortRollout}

// Limits of a rollout.
const (
	MaxRolloutSteps     = 20
	MaxRolloutDurationS = 7 * 86400
	MaxRolloutRequests  = 1_000_000_000
)

// validateRollout checks an endpoint's rollout: the spec's ranges, and a
// status that names backends of the model and a stage that exists.
// users maps each backend to the endpoints that send it requests, to
// keep an active rollout's candidate its own.
func validateRollout(p *problems, field string, e Endpoint, backends map[string]bool, users map[string][]string) {
	r := *e.Rollout
	st := r.Status
	ended := st != nil && !st.Phase.Active() // history: its backends may be gone
	if !backends[r.Candidate] && !ended {
		p.add(field+".candidate", "%q is not a backend of the model; name the backend to roll out, or create it first", r.Candidate)
	}
	validateRolloutStages(p, field, r)
	validateRolloutChecks(p, field+".checks", r.Checks)
	if st == nil {
		return
	}
	switch {
	case !backends[st.Primary] && !ended:
		p.add(field+".status.primary", "%q is not a backend of the model", st.Primary)
	case st.Primary == r.Candidate:
		p.add(field+".candidate", "%q is the backend that has the endpoint's traffic already; roll out another backend", r.Candidate)
	}
	if !slices.Contains([]RolloutPhase{RolloutWaiting, RolloutProgressing, RolloutPaused, RolloutPromoted, RolloutRolledBack}, st.Phase) {
		p.add(field+".status.phase", "%q is not a phase of a rollout", st.Phase)
	}
	if n := len(r.Stages()); st.Stage < 0 || st.Stage >= n {
		p.add(field+".status.stage", "is %d; the rollout has %d stages", st.Stage, n)
	}
	if len(st.Verdicts) > MaxRolloutVerdicts {
		p.add(field+".status.verdicts", "has %d verdicts; at most %d", len(st.Verdicts), MaxRolloutVerdicts)
	}
	if !st.Phase.Active() {
		return
	}
	for _, other := range users[r.Candidate] {
		if other != e.Name {
			p.add(field+".candidate", "%q also serves endpoint %q; a rollout judges its candidate by all of its answers, so roll out a backend no other endpoint uses", r.Candidate, other)
		}
	}
}

func validateRolloutStages(p *problems, field string, r Rollout) {
	hold := func(f string, durationS float64, minRequests int) {
		if !(durationS >= 0 && durationS <= MaxRolloutDurationS) {
			p.add(f+".duration_s", "is %v; set seconds from 0 to %d (a week)", durationS, MaxRolloutDurationS)
		}
		if minRequests < 0 || minRequests > MaxRolloutRequests {
			p.add(f+".min_requests", "is %d; set it from 0 to %d", minRequests, MaxRolloutRequests)
		}
	}
	if s := r.Shadow; s != nil {
		if !(s.Proportion > 0 && s.Proportion <= 1) {
			p.add(field+".shadow.proportion", "is %v; mirror a share above 0, at most 1", s.Proportion)
		}
		hold(field+".shadow", s.DurationS, s.MinRequests)
	}
	if h := r.Header; h != nil {
		validateKey(p, field+".header", h.Header, "")
		if h.Value == "" || len(h.Value) > MaxMatchValueLen {
			p.add(field+".header.value", "is %d bytes; give the value (1 to %d bytes) that sends a request to the candidate", len(h.Value), MaxMatchValueLen)
		}
		hold(field+".header", h.DurationS, h.MinRequests)
	}
	if len(r.Steps) == 0 || len(r.Steps) > MaxRolloutSteps {
		p.add(field+".steps", "has %d steps; give 1 to %d, such as weights 0.05, 0.25, 0.5, 1", len(r.Steps), MaxRolloutSteps)
	}
	last := 0.0
	for i, s := range r.Steps {
		f := fmt.Sprintf("%s.steps[%d]", field, i)
		if !(s.Weight > last && s.Weight <= 1) {
			p.add(f+".weight", "is %v; each step's weight is above the one before (%v) and at most 1", s.Weight, last)
		}
		if !math.IsNaN(s.Weight) {
			last = max(last, s.Weight)
		}
		hold(f, s.DurationS, s.MinRequests)
	}
}

func validateRolloutChecks(p *problems, field string, c RolloutChecks) {
	for _, f := range []struct {
		name, zero string
		v, lo, hi  float64
	}{
		{"max_error_rate", "0.01", c.MaxErrorRate, 0, 1},
		{"max_error_rate_increase", "no relative check", c.MaxErrorRateIncrease, 0, 1},
		{"latency_percentile", "99", c.LatencyPercentile, 0, 99.99},
		{"max_latency_ms", "no absolute bound", c.MaxLatencyMs, 0, 3_600_000},
		{"max_latency_ratio", "2", c.MaxLatencyRatio, 0, 1000},
		{"latency_tolerance_ms", "5", c.LatencyToleranceMs, 0, 3_600_000},
		{"max_ttft_ratio", "no time-to-first-token check", c.MaxTTFTRatio, 0, 1000},
		{"max_inter_token_ratio", "no inter-token check", c.MaxInterTokenRatio, 0, 1000},
		{"min_sample", "20", float64(c.MinSample), 0, MaxRolloutRequests},
	} {
		if !(f.v >= f.lo && f.v <= f.hi) {
			p.add(field+"."+f.name, "is %v; set it from %v to %v, or leave it out for %s", f.v, f.lo, f.hi, f.zero)
		}
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"max_latency_ratio", c.MaxLatencyRatio}, {"max_ttft_ratio", c.MaxTTFTRatio}, {"max_inter_token_ratio", c.MaxInterTokenRatio}} {
		if r.v != 0 && r.v < 1 {
			p.add(field+"."+r.name, "is %v; a ratio below 1 fails a candidate as fast as the primary; set 1 or more", r.v)
		}
	}
}

// backendUsers maps each backend to the endpoints that send it requests
// (traffic, shadows or match rules).
func backendUsers(m *Model) map[string][]string {
	out := map[string][]string{}
	for _, e := range m.Endpoints {
		seen := map[string]bool{}
		add := func(b string) {
			if !seen[b] {
				seen[b] = true
				out[b] = append(out[b], e.Name)
			}
		}
		for _, b := range SortedKeys(e.Traffic) {
			add(b)
		}
		for _, b := range SortedKeys(e.Shadows) {
			add(b)
		}
		for _, m := range e.Match {
			add(m.Backend)
		}
		for _, b := range SortedKeys(e.UsedBackends()) {
			add(b)
		}
	}
	return out
}

// cloneRollout returns a deep copy of r.
func cloneRollout(r Rollout) Rollout {
	if r.Shadow != nil {
		s := *r.Shadow
		r.Shadow = &s
	}
	if r.Header != nil {
		h := *r.Header
		r.Header = &h
	}
	r.Steps = slices.Clone(r.Steps)
	if r.Status != nil {
		st := *r.Status
		st.Verdicts = slices.Clone(st.Verdicts)
		r.Status = &st
	}
	return r
}

// cloneEndpointRollout gives e its own copy of its rollout.
func cloneEndpointRollout(e *Endpoint) {
	if e.Rollout != nil {
		r := cloneRollout(*e.Rollout)
		e.Rollout = &r
	}
}

// rolloutsEqual reports whether two endpoints' rollouts are the same.
func rolloutsEqual(a, b *Rollout) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(cloneRollout(*a), cloneRollout(*b))
}
