// Package backoff owns waiting between attempts: the growing delay
// (Backoff), the waiting itself (Sleep), and retrying until success
// (Retry). Every retry in servemesh, of a child process or of Consul, uses
// it.
package backoff

import (
	"context"
	"time"
)

// Backoff is a delay that starts at Min and doubles up to Max; an attempt
// that ran at least ResetAfter before failing starts again from Min.
type Backoff struct {
	Min, Max, ResetAfter time.Duration
	next                 time.Duration
}

// Consul is the backoff of a failed Consul call: half a second, doubling
// up to 10 s, back to half a second after a minute of success.
func Consul() Backoff {
	return Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second, ResetAfter: time.Minute}
}

// Next returns the delay before the next attempt; ran is how long the
// failed attempt ran (0 when that does not apply).
func (b *Backoff) Next(ran time.Duration) time.Duration {
	if b.next == 0 || ran >= b.ResetAfter {
		b.next = b.Min
	}
	d := b.next
	b.next = min(b.next*2, b.Max)
	return d
}

// Reset makes the next delay Min again, after a success.
func (b *Backoff) Reset() { b.next = 0 }

// Sleep waits d or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Retry calls attempt until it succeeds or ctx ends, waiting b's delays in
// between; failed (if not nil) hears of each failure and the pause before
// the next attempt. It returns nil, or the last error once ctx ended.
func Retry(ctx context.Context, b Backoff, attempt func(ctx context.Context) error, failed func(err error, pause time.Duration)) error {
	for {
		err := attempt(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		pause := b.Next(0)
		if failed != nil {
			failed(err, pause)
		}
		if !Sleep(ctx, pause) {
			return err
		}
	}
}
