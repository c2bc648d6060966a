package controller

import (
	"context"
	"reflect"

	"github.com/servemesh/servemesh/controlplane/model"
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

// checkCommands refuses next unless every process spec in it is the one
// current holds for the same backend, or ctx may run commands. It compares
// whole specs, never hashes, and runs under the write lock, against the
// state the change is applied to.
func checkCommands(ctx context.Context, current, next *model.Model) error {
	if mayRunCommands(ctx) {
		return nil
	}
	held := make(map[string]*model.ProcessSpec, len(current.Backends))
	for _, b := range current.Backends {
		held[b.Name] = b.Process
	}
	for _, b := range next.Backends {
		if b.Process == nil {
			continue
		}
		if cur := held[b.Name]; cur != nil && reflect.DeepEqual(*cur, *b.Process) {
			continue
		}
		return errorf(Forbidden, "backend %q: creating or changing its command (command, args, env or health path) runs code on servemesh's nodes, which needs a token with the exec scope (--token-file); a write token may change everything else", b.Name)
	}
	return nil
}
