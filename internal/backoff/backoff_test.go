package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := Backoff{Min: time.Second, Max: 5 * time.Second, ResetAfter: time.Minute}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next(0))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
	if d := b.Next(time.Minute); d != time.Second {
		t.Fatalf("after a long run the delay is %s, want Min", d)
	}
	b.Next(0)
	b.Reset()
	if d := b.Next(0); d != time.Second {
		t.Fatalf("after Reset the delay is %s, want Min", d)
	}
}

func TestRetry(t *testing.T) {
	calls, heard := 0, 0
	err := Retry(context.Background(), Backoff{Min: time.Millisecond, Max: time.Millisecond}, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}, func(error, time.Duration) { heard++ })
	if err != nil || calls != 3 || heard != 2 {
		t.Fatalf("Retry: err %v, %d calls, %d failures heard; want nil, 3, 2", err, calls, heard)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := Retry(ctx, Backoff{Min: time.Millisecond, Max: time.Millisecond}, func(context.Context) error { return errors.New("never") }, nil); err == nil {
		t.Fatal("Retry with an ended context returned nil; want the last error")
	}
}
