package consulwatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestLoopIndexes: each query waits past the last answer's index; an index
// that goes backwards starts over from 0, an index of 0 is waited past as
// 1, a failure keeps the index, and ErrDone ends the loop.
func TestLoopIndexes(t *testing.T) {
	answers := []struct {
		next uint64
		err  error
	}{{10, nil}, {12, nil}, {0, errors.New("consul is down")}, {5, nil}, {0, nil}, {7, nil}, {0, ErrDone}}
	var waited []uint64
	err := Loop(context.Background(), quiet, "test", func(_ context.Context, index uint64) (uint64, error) {
		waited = append(waited, index)
		a := answers[len(waited)-1]
		return a.next, a.err
	})
	if err != nil {
		t.Fatalf("Loop returned %v after ErrDone; want nil", err)
	}
	if want := []uint64{0, 10, 12, 12, 0, 1, 7}; !slices.Equal(waited, want) {
		t.Fatalf("indexes waited past %v, want %v", waited, want)
	}
}

func TestLoopEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := Loop(ctx, quiet, "test", func(ctx context.Context, _ uint64) (uint64, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Loop returned %v; want the context's error", err)
	}
}
