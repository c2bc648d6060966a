package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestWatchShowsEachChange: --watch reads again every interval and writes
// a reading only when it changed (off a terminal, under its time), and a
// Ctrl-C (the context) ends it without an error; on a terminal each
// reading clears the screen first.
func TestWatchShowsEachChange(t *testing.T) {
	for _, terminal := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		readings := []string{"a\n", "a\n", "b\n", "b\n", "c\n"}
		n := 0
		var out bytes.Buffer
		err := watch(ctx, &out, terminal, time.Millisecond, func(w io.Writer) error {
			_, err := io.WriteString(w, readings[n])
			if n++; n == len(readings) {
				cancel()
			}
			return err
		})
		if err != nil {
			t.Fatalf("a watch ended by Ctrl-C: %v", err)
		}
		frames := strings.Count(out.String(), "--- ")
		if terminal {
			frames = strings.Count(out.String(), "\033[H\033[2J")
		}
		if frames != 3 || !strings.HasSuffix(out.String(), "c\n") {
			t.Errorf("terminal %t: %d readings written, want 3 (one per change):\n%q", terminal, frames, out.String())
		}
	}
	// A failing read ends the watch with its error.
	err := watch(context.Background(), io.Discard, false, time.Millisecond, func(io.Writer) error { return errors.New("no controller answers") })
	if err == nil || err.Error() != "no controller answers" {
		t.Errorf("a failed read: %v", err)
	}
}

// TestBackendDescribe: describe shows a backend's replicas one by one
// with their address, node, health, restarts and age, and the endpoints
// that use it.
func TestBackendDescribe(t *testing.T) {
	unsetClientEnv(t)
	url := apiStandIn(t)
	code, out, errOut := runCLI("backend", "describe", "v1", "--server", url)
	if code != 0 {
		t.Fatalf("describe: %d %q", code, errOut)
	}
	for _, want := range []string{
		"Name:           v1", "Replicas:       3 desired, 3 running, 2 ready, 0 draining",
		"v1#000001  n1    127.0.0.1:9001  running  yes    0         2m   -",
		"v1#000002  n2    127.0.0.1:9002  running  no     4         1h   exited with status 1 (4 times)",
		"model     -      0.9     -",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe shows no %q:\n%s", want, out)
		}
	}
	if code, out, _ := runCLI("backend", "describe", "v1", "--server", url, "-o", "json"); code != 0 || !strings.Contains(out, `"used_by"`) {
		t.Errorf("describe -o json: %d\n%s", code, out)
	}
	if got := fmt.Sprint(age(time.Now().Add(-50*time.Hour).Unix(), time.Now())); got != "2d" {
		t.Errorf("age of 50 hours: %q", got)
	}
}

// TestAWatchEndedReadsNoMore: a watch whose context ends while a tick is
// due too reads nothing more (make flake: the test above read a sixth time
// after its fifth reading ended the watch, when select took the tick).
func TestAWatchEndedReadsNoMore(t *testing.T) {
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		reads := 0
		err := watch(ctx, io.Discard, false, time.Nanosecond, func(w io.Writer) error {
			reads++
			time.Sleep(time.Microsecond) // the next tick is due when the read ends
			cancel()
			return nil
		})
		if err != nil || reads != 1 {
			t.Fatalf("a watch ended during its first reading: %d readings, err %v; want 1, nil", reads, err)
		}
	}
}
