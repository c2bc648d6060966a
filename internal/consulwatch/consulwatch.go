// Package consulwatch owns following Consul with blocking queries: the one
// loop that waits past the last answer's index, starts over when the index
// goes backwards (a restored or replaced Consul), backs off and logs while
// Consul fails, and stops with its context or when its query says so.
// Every watcher of servemesh (the catalog, the stored state, leadership,
// Connect certificates) runs its queries through Loop.
package consulwatch

import (
	"context"
	"errors"
	"log/slog"

	"github.com/servemesh/servemesh/internal/backoff"
)

// ErrDone is what a Query returns to end Loop without an error.
var ErrDone = errors.New("consulwatch: done")

// Query runs one blocking query that waits until Consul's index passes
// index (0: answer at once), handles the answer, and returns its index.
type Query func(ctx context.Context, index uint64) (uint64, error)

// Loop runs query until ctx ends (it returns ctx's error) or query returns
// ErrDone (it returns nil). A failed query is logged with what and retried
// after a growing pause (backoff.Consul), the index kept. As Consul's
// documentation asks, an answer's index lower than the one waited past (a
// restored Consul) makes the next query start over from 0, and an index of
// 0 is waited past as 1.
func Loop(ctx context.Context, log *slog.Logger, what string, query Query) error {
	wait := backoff.Consul()
	var index uint64
	for {
		next, err := query(ctx, index)
		switch {
		case errors.Is(err, ErrDone):
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			pause := wait.Next(0)
			log.Warn("following Consul failed; retrying", "what", what, "err", err, "retry_in", pause)
			if !backoff.Sleep(ctx, pause) {
				return ctx.Err()
			}
			continue
		}
		wait.Reset()
		switch {
		case next < index:
			index = 0
		case next == 0:
			index = 1
		default:
			index = next
		}
	}
}
