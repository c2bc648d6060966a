package picker

import (
	"encoding/json"
	"hash/fnv"
	"time"

	"github.com/servemesh/servemesh/agent/picker/scoring"
)

// The picker's side of token load (scoring/tokens.go): each replica's
// queued prefill is counted in place and done; its prefill rate is
// measured here, from its cold prefills, and forgotten when the
// backend's spec changes.

// measurePrefill takes a cold prefill of tokens that took ttfb into r's
// prefill rate: afresh if the backend's process or user_config changed
// since its last (a new engine, new settings: its pace is not the old
// one's). Called with mu held.
func (p *Picker) measurePrefill(r *replicaLoad, tokens int, ttfb time.Duration) {
	if tokens < scoring.ColdTokens {
		return
	}
	if spec := p.specKey(r.backend); spec != r.prefillSpec {
		r.PrefillRate, r.prefillSpec = 0, spec
	}
	r.PrefillRate = scoring.PrefillRate(r.PrefillRate, tokens, ttfb)
	p.changed() // the checkpoint keeps it
}

// specKey is a hash of what makes backend's replicas prefill as they
// do: its process and its user_config.
func (p *Picker) specKey(backend string) uint64 {
	b, _ := p.desired().Backend(backend)
	process, _ := json.Marshal(b.Process)
	h := fnv.New64a()
	_, _ = h.Write(process)
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(b.Config.UserConfig)
	return h.Sum64()
}

// typicalPrefillRate is scoring.TypicalPrefillRate of backend's replicas
// here, for those with no cold prefill yet. Called with mu held.
func (p *Picker) typicalPrefillRate(backend string) float64 {
	var all []scoring.Replica
	for _, r := range p.replicas {
		if r.backend == backend {
			all = append(all, r.Replica)
		}
	}
	return scoring.TypicalPrefillRate(all)
}
