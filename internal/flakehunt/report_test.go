package main

import (
	"bytes"
	"strings"
	"testing"
)

// stream is a go test -json stream: TestA passes twice and fails once,
// TestB passes, and package q fails to build.
const stream = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:9: want 2, got 1\n"}
{"Action":"fail","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"pass","Package":"p","Test":"TestB"}
{"Action":"fail","Package":"p"}
# q
q/q.go:3:1: syntax error
{"Action":"start","Package":"q"}
{"Action":"output","Package":"q","Output":"FAIL\tq [build failed]\n"}
{"Action":"fail","Package":"q"}
`

func TestReportCountsRunsAndKeepsFailuresOutput(t *testing.T) {
	var raw bytes.Buffer
	rep, err := read(strings.NewReader(stream), &raw)
	if err != nil {
		t.Fatal(err)
	}
	if raw.String() != stream {
		t.Errorf("the raw log is not the stream as read:\n%s", raw.String())
	}
	if runs, tests := rep.runs(); runs != 4 || tests != 2 {
		t.Errorf("runs %d of %d tests; want 4 runs of 2 tests", runs, tests)
	}
	failed := rep.failedTests()
	want := []testID{{"p", ""}, {"p", "TestA"}, {"q", ""}}
	if len(failed) != len(want) {
		t.Fatalf("failed tests %v; want %v", failed, want)
	}
	for i := range want {
		if failed[i] != want[i] {
			t.Fatalf("failed tests %v; want %v", failed, want)
		}
	}
	a := rep.tests[testID{"p", "TestA"}]
	if a.runs != 3 || a.failed != 1 || len(a.failures) != 1 {
		t.Fatalf("TestA: %d runs, %d failed, %d kept; want 3, 1, 1", a.runs, a.failed, len(a.failures))
	}
	if got := strings.Join(a.failures[0].output, "\n"); got != "=== RUN   TestA\n    a_test.go:9: want 2, got 1" {
		t.Errorf("TestA's failure kept %q; want the failed run's output alone", got)
	}
	var out bytes.Buffer
	rep.write(&out, "unit")
	for _, line := range []string{
		"flake: unit: 4 runs of 2 tests, 3 tests failed at least once",
		"FAIL p.TestA: 1 of 3 runs",
		"a_test.go:9: want 2, got 1",
		"FAIL q (the package",
		"[build failed]",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the summary lacks %q:\n%s", line, out.String())
		}
	}
}

func TestReportKeepsDistinctFailuresAndClipsLongLines(t *testing.T) {
	rep := &report{tests: map[testID]*tally{}}
	long := strings.Repeat("x", 3*maxWidth)
	for _, msg := range []string{"same", "same", long} {
		rep.add(event{Action: "run", Package: "p", Test: "TestA"})
		rep.add(event{Action: "output", Package: "p", Test: "TestA", Output: msg + "\n"})
		rep.add(event{Action: "fail", Package: "p", Test: "TestA"})
	}
	if a := rep.tests[testID{"p", "TestA"}]; a.failed != 3 || len(a.failures) != 2 {
		t.Fatalf("three failures, two alike: %d failed, %d kept; want 3 failed, 2 kept", a.failed, len(a.failures))
	}
	var out bytes.Buffer
	rep.write(&out, "unit")
	if strings.Contains(out.String(), long) || !strings.Contains(out.String(), "more characters in the raw log") {
		t.Errorf("a line of %d characters printed whole, or clipped without saying so:\n%.600s", len(long), out.String())
	}
}

func TestAPackageFailureShowsThePackagesLastLines(t *testing.T) {
	// A goroutine that outlived its test panicked: the panic is printed
	// as another test's output, and the package fails with no test failed.
	rep, err := read(strings.NewReader(`{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"panic: Log in goroutine after TestA has completed\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t1.0s\n"}
{"Action":"fail","Package":"p"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.write(&out, "unit")
	if !strings.Contains(out.String(), "panic: Log in goroutine after TestA has completed") {
		t.Errorf("a package that failed outside its tests: the summary lacks the panic that failed it:\n%s", out.String())
	}
}

func TestReportOfNoTestSaysWhy(t *testing.T) {
	rep, err := read(strings.NewReader("go: cannot find main module\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.write(&out, "unit")
	if !strings.Contains(out.String(), "ran no test") || !strings.Contains(out.String(), "cannot find main module") {
		t.Errorf("a phase that ran nothing: %q; want it to say so, with go's words", out.String())
	}
}

func TestPhasesRefuseUnknownNames(t *testing.T) {
	if _, err := phasesOf(options{phases: "unit,soak", duty: 0.5}); err == nil || !strings.Contains(err.Error(), `"soak"`) {
		t.Errorf("an unknown phase: %v; want an error naming it", err)
	}
	if _, err := phasesOf(options{phases: "unit", duty: 2}); err == nil || !strings.Contains(err.Error(), "-duty") {
		t.Errorf("a duty of 2: %v; want an error naming -duty", err)
	}
	ps, err := phasesOf(options{phases: "unit,e2e", count: 20, cpu: "1,2,4", p: 4, e2eCount: 2, parallel: 4, pkgs: "./...", duty: 0.5})
	if err != nil || len(ps) != 2 || !strings.Contains(strings.Join(ps[0].args, " "), "-count=20 -cpu=1,2,4 -p=4") ||
		!strings.Contains(strings.Join(ps[1].args, " "), "-tags=e2e -count=2 -parallel=4") {
		t.Errorf("phases %+v, %v; want unit at -count=20 -cpu=1,2,4 and e2e twice", ps, err)
	}
}

// TestReportKeepsWhatAFailedTestReported: a test that reports its failure
// and then dumps more than the kept lines (its daemons' logs) is shown
// with its report, not the dump's tail alone.
func TestReportKeepsWhatAFailedTestReported(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"Action":"run","Package":"p","Test":"TestD"}` + "\n")
	b.WriteString(`{"Action":"output","Package":"p","Test":"TestD","Output":"    d_test.go:7: timed out waiting for the agent\n"}` + "\n")
	for range 5 * maxLines {
		b.WriteString(`{"Action":"output","Package":"p","Test":"TestD","Output":"        a daemon's log line\n"}` + "\n")
	}
	b.WriteString(`{"Action":"fail","Package":"p","Test":"TestD"}` + "\n")
	rep, err := read(strings.NewReader(b.String()), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.write(&out, "e2e")
	if !strings.Contains(out.String(), "what the test reported:\n        d_test.go:7: timed out waiting for the agent\n  its last lines:") {
		t.Fatalf("the summary leaves out what the test reported:\n%s", out.String())
	}
}
