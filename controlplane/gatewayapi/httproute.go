package gatewayapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	gw "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/meshspec"
)

// APIVersion and Kind are what an HTTPRoute document says it is.
const (
	APIVersion = "gateway.networking.k8s.io/v1"
	Kind       = "HTTPRoute"
)

// IsHTTPRoute reports whether a YAML or JSON document is an HTTPRoute.
func IsHTTPRoute(doc []byte) bool {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	js, err := yaml.YAMLToJSON(doc)
	return err == nil && json.Unmarshal(js, &head) == nil && head.Kind == Kind && strings.HasPrefix(head.APIVersion, "gateway.networking.k8s.io/")
}

// Endpoint reads one HTTPRoute document into the endpoint it describes.
func Endpoint(doc []byte) (meshspec.Endpoint, error) {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return meshspec.Endpoint{}, fmt.Errorf("HTTPRoute: %w", err)
	}
	var r gw.HTTPRoute
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return meshspec.Endpoint{}, fmt.Errorf("HTTPRoute: %w (not a field of %s %s)", err, APIVersion, Kind)
	}
	if r.APIVersion != APIVersion {
		return meshspec.Endpoint{}, fmt.Errorf("HTTPRoute %q: apiVersion %q: servemesh reads %s", r.Name, r.APIVersion, APIVersion)
	}
	if r.Name == "" {
		return meshspec.Endpoint{}, errors.New("HTTPRoute: metadata.name is empty: it names the endpoint")
	}
	t := translation{route: r.Name}
	e := t.endpoint(r)
	if len(t.problems) > 0 {
		return meshspec.Endpoint{}, fmt.Errorf("HTTPRoute %q:\n  - %s", r.Name, strings.Join(t.problems, "\n  - "))
	}
	return e, nil
}

// translation gathers every problem of one HTTPRoute.
type translation struct {
	route    string
	problems []string
}

func (t *translation) refuse(field, format string, args ...any) {
	t.problems = append(t.problems, field+": "+fmt.Sprintf(format, args...))
}

func (t *translation) endpoint(r gw.HTTPRoute) meshspec.Endpoint {
	e := meshspec.Endpoint{Name: r.Name}
	if len(r.Spec.Hostnames) > 0 {
		t.refuse("spec.hostnames", "servemesh serves an endpoint by path on the public listener and by its name (%q) in the mesh; remove hostnames", r.Name)
	}
	for i, p := range r.Spec.ParentRefs {
		if p.Kind != nil && *p.Kind != "Gateway" {
			t.refuse(fmt.Sprintf("spec.parentRefs[%d].kind", i), "%q: servemesh attaches routes to its Gateway, every node's public listener; name a Gateway", *p.Kind)
		}
	}
	if len(r.Spec.Rules) == 0 {
		t.refuse("spec.rules", "none: give one rule with the endpoint's backendRefs")
		return e
	}
	split := -1
	for i, rule := range r.Spec.Rules {
		field := fmt.Sprintf("spec.rules[%d]", i)
		t.ruleCommon(field, rule)
		if !hasHeaderMatch(rule) {
			if split >= 0 {
				t.refuse(field, "a second rule without header matches (rule %d is one): servemesh splits an endpoint's requests by one set of weights; merge their backendRefs", split)
				continue
			}
			split = i
			t.split(field, rule, &e)
			continue
		}
		if m, ok := t.matchRule(field, rule); ok {
			e.Match = append(e.Match, m...)
		}
	}
	if split < 0 {
		t.refuse("spec.rules", "every rule matches headers: add one without, whose backendRefs take the other requests")
	}
	t.samePath(r.Spec.Rules, &e)
	return e
}

// ruleCommon refuses what no rule may have.
func (t *translation) ruleCommon(field string, rule gw.HTTPRouteRule) {
	if rule.Retry != nil {
		t.refuse(field+".retry", "not supported; set the endpoint's retry policy with servemesh (retry_on, attempts)")
	}
	if rule.SessionPersistence != nil {
		t.refuse(field+".sessionPersistence", "not supported; servemesh keeps a client on one backend by a header or cookie (the endpoint's sticky key)")
	}
	for i, m := range rule.Matches {
		mf := fmt.Sprintf("%s.matches[%d]", field, i)
		if len(m.QueryParams) > 0 {
			t.refuse(mf+".queryParams", "not supported; match a header instead")
		}
		if m.Path != nil && m.Path.Type != nil && *m.Path.Type != gw.PathMatchPathPrefix {
			t.refuse(mf+".path.type", "%s: servemesh routes by path prefix; use PathPrefix", *m.Path.Type)
		}
	}
	for i, b := range rule.BackendRefs {
		t.backendRef(fmt.Sprintf("%s.backendRefs[%d]", field, i), b.BackendObjectReference)
		if len(b.Filters) > 0 {
			t.refuse(fmt.Sprintf("%s.backendRefs[%d].filters", field, i), "not supported; put a RequestMirror filter on the rule")
		}
	}
}

// backendRef refuses a reference to anything but a servemesh backend.
func (t *translation) backendRef(field string, ref gw.BackendObjectReference) {
	if ref.Group != nil && *ref.Group != "" {
		t.refuse(field+".group", "%q: servemesh backends are the core group's (leave group out)", *ref.Group)
	}
	if ref.Kind != nil && *ref.Kind != "Service" {
		t.refuse(field+".kind", "%q: a backendRef names a servemesh backend, of kind Service (or no kind)", *ref.Kind)
	}
	if ref.Namespace != nil {
		t.refuse(field+".namespace", "servemesh has no namespaces; leave it out")
	}
}

func hasHeaderMatch(rule gw.HTTPRouteRule) bool {
	for _, m := range rule.Matches {
		if len(m.Headers) > 0 {
			return true
		}
	}
	return false
}

// split reads the rule without header matches: methods, weights,
// mirrors, timeouts.
func (t *translation) split(field string, rule gw.HTTPRouteRule, e *meshspec.Endpoint) {
	anyMethod := len(rule.Matches) == 0
	for _, m := range rule.Matches {
		if m.Method == nil {
			anyMethod = true
		} else if !slices.Contains(e.Methods, string(*m.Method)) {
			e.Methods = append(e.Methods, string(*m.Method))
		}
	}
	if anyMethod {
		e.Methods = []string{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}
	}
	sort.Strings(e.Methods)
	if len(rule.BackendRefs) == 0 {
		t.refuse(field+".backendRefs", "none: name the backends this endpoint's requests go to")
	}
	total := 0.0
	for _, b := range rule.BackendRefs {
		total += float64(weight(b))
	}
	if total == 0 && len(rule.BackendRefs) > 0 {
		t.refuse(field+".backendRefs", "every weight is 0: give at least one backend a weight")
	}
	e.Traffic = map[string]float64{}
	for _, b := range rule.BackendRefs {
		if total > 0 {
			e.Traffic[string(b.Name)] += float64(weight(b)) / total
		}
	}
	for i, f := range rule.Filters {
		t.mirror(fmt.Sprintf("%s.filters[%d]", field, i), f, e)
	}
	if to := rule.Timeouts; to != nil {
		e.TimeoutS = t.seconds(field+".timeouts.request", to.Request)
		e.PerTryTimeoutS = t.seconds(field+".timeouts.backendRequest", to.BackendRequest)
	}
}

func weight(b gw.HTTPBackendRef) int32 {
	if b.Weight == nil {
		return 1
	}
	return *b.Weight
}

// mirror reads a RequestMirror filter into a shadow; any other filter is
// refused.
func (t *translation) mirror(field string, f gw.HTTPRouteFilter, e *meshspec.Endpoint) {
	if f.Type != gw.HTTPRouteFilterRequestMirror || f.RequestMirror == nil {
		t.refuse(field, "%s: servemesh supports the RequestMirror filter alone", f.Type)
		return
	}
	m := f.RequestMirror
	t.backendRef(field+".requestMirror.backendRef", m.BackendRef)
	p := 1.0
	switch {
	case m.Percent != nil && m.Fraction != nil:
		t.refuse(field+".requestMirror", "percent and fraction: give one")
	case m.Percent != nil:
		p = float64(*m.Percent) / 100
	case m.Fraction != nil:
		den := int32(100)
		if m.Fraction.Denominator != nil {
			den = *m.Fraction.Denominator
		}
		if den <= 0 {
			t.refuse(field+".requestMirror.fraction.denominator", "%d: must be positive", den)
			return
		}
		p = float64(m.Fraction.Numerator) / float64(den)
	}
	if e.Shadows == nil {
		e.Shadows = map[string]float64{}
	}
	e.Shadows[string(m.BackendRef.Name)] = p
}

// seconds reads a Gateway API duration (such as 10s or 1m30s); 0 when unset.
func (t *translation) seconds(field string, d *gw.Duration) float64 {
	if d == nil {
		return 0
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil || v < 0 {
		t.refuse(field, "%q is not a duration such as 10s or 1m30s", *d)
		return 0
	}
	return v.Seconds()
}

// matchRule reads a rule whose matches each test one header into match
// rules sending them to its one backend.
func (t *translation) matchRule(field string, rule gw.HTTPRouteRule) ([]meshspec.RequestMatch, bool) {
	ok := true
	if len(rule.BackendRefs) != 1 {
		t.refuse(field+".backendRefs", "%d: a rule that matches headers sends them to one backend", len(rule.BackendRefs))
		ok = false
	}
	if len(rule.Filters) > 0 {
		t.refuse(field+".filters", "not supported on a rule that matches headers; mirror on the rule without header matches")
		ok = false
	}
	if rule.Timeouts != nil {
		t.refuse(field+".timeouts", "not supported on a rule that matches headers; set timeouts on the rule without header matches")
		ok = false
	}
	var out []meshspec.RequestMatch
	for i, m := range rule.Matches {
		mf := fmt.Sprintf("%s.matches[%d]", field, i)
		if m.Method != nil {
			t.refuse(mf+".method", "not supported with header matches: the endpoint's methods are the rule without header matches'")
			ok = false
		}
		if len(m.Headers) != 1 {
			t.refuse(mf+".headers", "%d headers: servemesh matches one header per match; split them into matches of one", len(m.Headers))
			ok = false
			continue
		}
		h := m.Headers[0]
		rm := meshspec.RequestMatch{Header: strings.ToLower(string(h.Name))}
		switch {
		case h.Type == nil || *h.Type == gw.HeaderMatchExact:
			rm.Exact = h.Value
		case *h.Type == gw.HeaderMatchRegularExpression:
			rm.Regex = h.Value
		default:
			t.refuse(mf+".headers[0].type", "%s: use Exact or RegularExpression", *h.Type)
			ok = false
		}
		if len(rule.BackendRefs) == 1 {
			rm.Backend = string(rule.BackendRefs[0].Name)
		}
		out = append(out, rm)
	}
	return out, ok
}

// samePath sets the endpoint's route: every match's path prefix, the same
// in every rule ("/" when no match gives one).
func (t *translation) samePath(rules []gw.HTTPRouteRule, e *meshspec.Endpoint) {
	paths := map[string]bool{}
	for _, rule := range rules {
		if len(rule.Matches) == 0 {
			paths["/"] = true
		}
		for _, m := range rule.Matches {
			p := "/"
			if m.Path != nil && m.Path.Value != nil {
				p = *m.Path.Value
			}
			paths[p] = true
		}
	}
	if len(paths) != 1 {
		t.refuse("spec.rules[*].matches[*].path", "%d path prefixes (%s): a servemesh endpoint has one route; make one HTTPRoute for each", len(paths), strings.Join(sortedKeys(paths), ", "))
		return
	}
	for p := range paths {
		if p == "/" {
			t.refuse("spec.rules[*].matches[*].path", `"/": a servemesh endpoint's route is a path such as /model; give a PathPrefix`)
			return
		}
		e.Route = strings.TrimSuffix(p, "/")
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
