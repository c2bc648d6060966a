package controller

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/servemesh/servemesh/meshspec"
)

type commandsKey struct{}

// MayRunCommands returns a context whose operations may create or change a
// backend's process spec: its command, arguments, environment and health
// path. That is code execution on every node that runs the backend's
// replicas, so the API grants it only to tokens with the exec scope.
// Without it, an operation that would store a new or changed spec is
// refused (Forbidden) and changes nothing.
func MayRunCommands(ctx context.Context) context.Context {
	return context.WithValue(ctx, commandsKey{}, true)
}

func mayRunCommands(ctx context.Context) bool {
	ok, _ := ctx.Value(commandsKey{}).(bool)
	return ok
}

type writtenKey struct{}

// specsWritten marks ctx as an operation whose process specs the caller
// wrote (CreateBackend, Apply), so their environment values are the
// caller's claims (see unredact); other operations derive the specs from
// what is stored.
func specsWritten(ctx context.Context) context.Context {
	return context.WithValue(ctx, writtenKey{}, true)
}

func writtenByCaller(ctx context.Context) bool {
	ok, _ := ctx.Value(writtenKey{}).(bool)
	return ok
}

// guard checks what a change may do beyond what validation checks: it may
// run new commands only with the caller's authority, and name only the
// replica addresses the operator allows. It looks only at what the change
// makes new, so a stored state accepted under other settings keeps working.
// It runs under the write lock, against the state the change is applied to.
func (c *Controller) guard(ctx context.Context, current, next *meshspec.Model) error {
	if err := checkCommands(ctx, current, next); err != nil {
		return err
	}
	if err := checkCollector(ctx, current, next); err != nil {
		return err
	}
	if c.plaintext {
		if err := checkPlaintext(current, next); err != nil {
			return err
		}
	}
	return checkAddresses(c.addresses, current, next)
}

// checkPlaintext refuses, in a mesh without mTLS, a load_aware setting new
// to its backend: a backend's replicas are picked by load by the picker on
// each replica's node, behind the node's inbound listener, which only a
// mesh with mTLS has; without it every caller calls the replicas directly
// and the setting would do nothing. A backend stored with it before this
// check keeps its setting (and status says it is not served).
func checkPlaintext(current, next *meshspec.Model) error {
	had, picked := make(map[string]bool, len(current.Backends)), make(map[string]bool, len(current.Backends))
	for _, b := range current.Backends {
		had[b.Name], picked[b.Name] = b.Config.LoadAware != nil, b.Config.EndpointPicker != nil
	}
	for _, b := range next.Backends {
		if b.Config.LoadAware != nil && !had[b.Name] {
			return &Error{Kind: Invalid, Msg: fmt.Sprintf("refused: backend %q config.load_aware", b.Name), Err: ErrLoadAwarePlaintext}
		}
		if b.Config.EndpointPicker != nil && !picked[b.Name] {
			return &Error{Kind: Invalid, Msg: fmt.Sprintf("refused: backend %q config.endpoint_picker", b.Name), Err: ErrEndpointPickerPlaintext}
		}
	}
	rewrote := map[string]bool{}
	for _, e := range current.Endpoints {
		for _, m := range rewrittenModels(e) {
			rewrote[e.Name+"\x00"+m] = true
		}
	}
	for _, e := range next.Endpoints {
		for _, m := range rewrittenModels(e) {
			if !rewrote[e.Name+"\x00"+m] {
				return &Error{Kind: Invalid, Msg: fmt.Sprintf("refused: endpoint %q model_routing.models.%s.rewrite", e.Name, m), Err: ErrRewritePlaintext}
			}
		}
	}
	return nil
}

// rewrittenModels are the models of e's model routing with a rewrite,
// sorted.
func rewrittenModels(e meshspec.Endpoint) []string {
	if e.ModelRouting == nil {
		return nil
	}
	var out []string
	for _, m := range meshspec.SortedKeys(e.ModelRouting.Models) {
		if len(e.ModelRouting.Models[m].Rewrite) > 0 {
			out = append(out, m)
		}
	}
	return out
}

// ErrRewritePlaintext is why a mesh without mTLS refuses a model rewrite.
var ErrRewritePlaintext = errors.New("this mesh runs without mTLS (the controller's --plaintext), where no calling node runs a picker to rewrite " +
	"a request's model; remove the rewrite (route the model's names apart instead), or run the controller and agents with mTLS (without --plaintext)")

// ErrLoadAwarePlaintext is why a mesh without mTLS refuses load_aware.
var ErrLoadAwarePlaintext = errors.New("this mesh runs without mTLS (the controller's --plaintext), where no node's picker stands in front of its replicas, " +
	"so picking replicas by load cannot be served; remove load_aware, or run the controller and agents with mTLS (without --plaintext)")

// ErrEndpointPickerPlaintext is why a mesh without mTLS refuses an
// endpoint picker.
var ErrEndpointPickerPlaintext = errors.New("this mesh runs without mTLS (the controller's --plaintext), where no node's inbound listener stands in front of its replicas " +
	"to send a request to the one an endpoint picker names; remove endpoint_picker, or run the controller and agents with mTLS (without --plaintext)")

// checkAddresses refuses a static replica address, or an endpoint
// picker's, that is new to its backend and that policy refuses.
func checkAddresses(policy meshspec.AddressPolicy, current, next *meshspec.Model) error {
	held := make(map[string]map[string]bool, len(current.Backends))
	for _, b := range current.Backends {
		held[b.Name] = make(map[string]bool, len(b.Replicas)+1)
		for _, r := range b.Replicas {
			held[b.Name][r.Address] = true
		}
		if e := b.Config.EndpointPicker; e != nil {
			held[b.Name][e.Address] = true
		}
	}
	for _, b := range next.Backends {
		if e := b.Config.EndpointPicker; e != nil && !held[b.Name][e.Address] {
			if err := policy.Check(e.Address); err != nil {
				return &Error{Kind: Invalid, Msg: fmt.Sprintf("refused: backend %q config.endpoint_picker.address", b.Name), Err: err}
			}
		}
		for i, r := range b.Replicas {
			if held[b.Name][r.Address] {
				continue
			}
			if err := policy.Check(r.Address); err != nil {
				return &Error{Kind: Invalid, Msg: fmt.Sprintf("refused: backend %q replicas[%d]", b.Name, i), Err: err}
			}
		}
	}
	return nil
}

// checkCommands refuses next unless every process spec in it is the one
// current holds for the same backend, or ctx may run commands. It compares
// whole specs, never hashes, and runs under the write lock, against the
// state the change is applied to.
func checkCommands(ctx context.Context, current, next *meshspec.Model) error {
	exec := mayRunCommands(ctx)
	held := make(map[string]*meshspec.ProcessSpec, len(current.Backends))
	for _, b := range current.Backends {
		held[b.Name] = b.Process
	}
	for _, b := range next.Backends {
		if b.Process == nil {
			continue
		}
		if err := unredact(b.Name, b.Process, held[b.Name], exec || !writtenByCaller(ctx)); err != nil {
			return err
		}
		if cur := held[b.Name]; exec || (cur != nil && reflect.DeepEqual(*cur, *b.Process)) {
			continue
		}
		return errorf(Forbidden, "backend %q: creating or changing its command (command, args, env or health path) runs code on servemesh's nodes, which needs a token with the exec scope (--token-file); a write token may change everything else", b.Name)
	}
	return nil
}

// unredact gives next the stored values where it has the placeholder
// meshspec.RedactedEnv (what a caller without the exec scope reads), so a
// spec read and written back is unchanged. Unless trusted (the exec scope,
// or a spec the controller derived from the stored one), any other value
// is refused, whether or not it is the stored one: answering otherwise
// would tell the caller a guessed secret was right.
func unredact(backend string, next, stored *meshspec.ProcessSpec, trusted bool) error {
	for k, v := range next.Env {
		old, ok := "", false
		if stored != nil {
			old, ok = stored.Env[k]
		}
		if v != meshspec.RedactedEnv {
			if trusted {
				continue
			}
			ok = false
		}
		if !ok && trusted {
			return errorf(Invalid, "backend %q: env %s: %q keeps a stored value, and the backend stores none; give the value", backend, k, meshspec.RedactedEnv)
		}
		if !ok {
			return errorf(Forbidden, "backend %q: env %s: setting an environment value needs a token with the trusted scope (--token-file); a write token may only write back %q, which keeps the stored value", backend, k, meshspec.RedactedEnv)
		}
		next.Env[k] = old
	}
	return nil
}

// UnservedSettings are the adopted state's settings this mesh does not
// serve, one sentence each: in a mesh without mTLS, load_aware and model
// rewrites stored before they were refused there.
func (c *Controller) UnservedSettings() []string {
	if !c.plaintext {
		return nil
	}
	var out []string
	m := c.adopted.Load().model
	for _, b := range m.Backends {
		if b.Config.LoadAware != nil {
			out = append(out, fmt.Sprintf("backend %s config.load_aware is not served: %v", b.Name, ErrLoadAwarePlaintext))
		}
		if b.Config.EndpointPicker != nil {
			out = append(out, fmt.Sprintf("backend %s config.endpoint_picker is not served: %v", b.Name, ErrEndpointPickerPlaintext))
		}
	}
	for _, e := range m.Endpoints {
		for _, model := range rewrittenModels(e) {
			out = append(out, fmt.Sprintf("endpoint %s model_routing.models.%s.rewrite is not served: %v", e.Name, model, ErrRewritePlaintext))
		}
	}
	return out
}
