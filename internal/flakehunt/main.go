// Package main is the flakehunt command: it runs the test suite many times under a CPU and
// scheduler load it makes itself, and prints every test that failed at
// least once, with its output: `make flake`. A test that fails here fails
// by chance in CI sooner or later.
//
// It owns three phases, each a `go test -json` run read as it streams:
//
//  1. unit: the unit tests -count times at each -cpu (GOMAXPROCS) setting;
//  2. race: the unit tests once with the race detector;
//  3. e2e: the end-to-end tests (build tag e2e, the real Envoy and Consul)
//     -e2e-count times.
//
// While a phase runs, -load goroutines, each locked to an OS thread,
// alternate short random bursts of spinning with short random sleeps:
// the test processes compete for the cores and are preempted at random
// points, as on a loaded CI machine. The load starts and stops with the
// hunt. Each phase's raw `go test -json` output is kept under -out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options are the hunt's flags.
type options struct {
	count, e2eCount int
	parallel, p     int
	cpu             string
	load            int
	duty            float64
	phases          string
	run             string
	pkgs            string
	out             string
	timeout         time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.count, "count", 20, "runs of each unit test at each -cpu setting")
	flag.IntVar(&o.p, "p", 4, "unit test packages run at once (go test -p): more than the cores, so packages that wait on timers overlap and press on each other")
	flag.StringVar(&o.cpu, "cpu", "1,2,4", "the GOMAXPROCS settings the unit tests run at (go test -cpu)")
	flag.IntVar(&o.e2eCount, "e2e-count", 2, "runs of each end-to-end test")
	flag.IntVar(&o.parallel, "parallel", 4, "end-to-end tests run at once (go test -parallel; make test's TEST_PARALLEL)")
	flag.IntVar(&o.load, "load", runtime.NumCPU(), "goroutines (each on its own thread) that load the cores while the tests run; 0: none")
	flag.Float64Var(&o.duty, "duty", 0.5, "the share of time each load goroutine spins, between 0 and 1")
	flag.StringVar(&o.phases, "phases", "unit,race,e2e", "the phases to run, comma-separated: unit, race, e2e")
	flag.StringVar(&o.run, "run", "", "run only the tests matching this regular expression (go test -run)")
	flag.StringVar(&o.pkgs, "pkgs", "./...", "the packages of the unit and race phases")
	flag.StringVar(&o.out, "out", ".run/flake", "the folder for each phase's raw go test -json output")
	flag.DurationVar(&o.timeout, "timeout", 90*time.Minute, "go test's -timeout for each phase")
	flag.Parse()
	os.Exit(run(o))
}

// run hunts as o says and returns the exit code: 1 if a test failed, 2 if
// the hunt could not run.
func run(o options) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed, err := hunt(ctx, o, os.Stdout)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "flake:", err)
		return 2
	case failed:
		return 1
	}
	return 0
}

// phase is one `go test` run of the hunt.
type phase struct {
	name string
	args []string // after `go test -json`
}

// phasesOf are the phases o asks for, in the order they run.
func phasesOf(o options) ([]phase, error) {
	var run []string
	if o.run != "" {
		run = []string{"-run", o.run}
	}
	timeout := "-timeout=" + o.timeout.String()
	all := map[string]phase{
		"unit": {"unit", append([]string{"-count=" + strconv.Itoa(o.count), "-cpu=" + o.cpu, "-p=" + strconv.Itoa(o.p), timeout}, append(run, o.pkgs)...)},
		"race": {"race", append([]string{"-race", "-count=1", timeout}, append(run, o.pkgs)...)},
		"e2e": {"e2e", append([]string{"-tags=e2e", "-count=" + strconv.Itoa(o.e2eCount), "-parallel=" + strconv.Itoa(o.parallel), timeout},
			append(run, "./e2e/")...)},
	}
	var out []phase
	for _, name := range strings.Split(o.phases, ",") {
		p, ok := all[strings.TrimSpace(name)]
		if !ok {
			return nil, fmt.Errorf("-phases: no phase %q; the phases are unit, race and e2e", name)
		}
		out = append(out, p)
	}
	if o.duty < 0 || o.duty > 1 {
		return nil, fmt.Errorf("-duty %v: give a share between 0 and 1, such as 0.5", o.duty)
	}
	return out, nil
}

// hunt runs the phases under load and writes each one's summary to w,
// then the whole hunt's; failed says a test failed at least once (or a
// phase ran no test).
func hunt(ctx context.Context, o options, w io.Writer) (failed bool, err error) {
	phases, err := phasesOf(o)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return false, fmt.Errorf("-out: %w", err)
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	done := startLoad(loadCtx, o.load, o.duty)
	defer func() { stopLoad(); <-done }()
	fmt.Fprintf(w, "flake: %d load goroutines spinning %.0f%% of the time on %d cores\n", o.load, 100*o.duty, runtime.NumCPU())
	var summary strings.Builder
	for _, p := range phases {
		start := time.Now()
		fmt.Fprintf(w, "flake: %s: go test -json %s\n", p.name, strings.Join(p.args, " "))
		rep, err := runPhase(ctx, p, filepath.Join(o.out, p.name+".json"))
		if err != nil {
			return false, fmt.Errorf("%s: %w", p.name, err)
		}
		rep.write(&summary, fmt.Sprintf("%s (%s)", p.name, time.Since(start).Round(time.Second)))
		runs, _ := rep.runs()
		failed = failed || len(rep.failedTests()) > 0 || runs == 0
	}
	fmt.Fprint(w, "\n", summary.String())
	if failed {
		fmt.Fprintln(w, "flake: FAILED: the tests above failed at least once; fix each by its class (DEVELOPING.md, Flaky tests)")
	} else {
		fmt.Fprintln(w, "flake: no test failed")
	}
	return failed, nil
}

// runPhase runs one phase's go test and reads its events as they come,
// keeping the raw stream in rawPath.
func runPhase(ctx context.Context, p phase, rawPath string) (*report, error) {
	raw, err := os.Create(rawPath)
	if err != nil {
		return nil, fmt.Errorf("the raw log: %w", err)
	}
	defer func() { _ = raw.Close() }()
	cmd := exec.CommandContext(ctx, "go", append([]string{"test", "-json"}, p.args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("go test: %w", err)
	}
	cmd.Stderr = cmd.Stdout // build errors, read as lines that are not events
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("go test: %w", err)
	}
	rep, readErr := read(out, raw)
	waitErr := cmd.Wait()
	var exit *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exit) {
		return nil, fmt.Errorf("go test: %w", waitErr)
	}
	return rep, readErr
}
