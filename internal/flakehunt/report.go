package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// testID names a test of a package; Test is "" for the package itself
// (its build, its TestMain, a panic or timeout outside any test).
type testID struct{ Package, Test string }

func (id testID) String() string {
	if id.Test == "" {
		return id.Package + " (the package: build, TestMain, a panic or a timeout)"
	}
	return id.Package + "." + id.Test
}

// failure is one failed run of a test: the lines its test reported
// (t.Error, t.Fatal, t.Log: "file_test.go:N: ..."), kept from the whole
// run, then its output's last lines. A test that dumps its daemons' logs
// when it fails prints its reason long before its last line.
type failure struct {
	messages []string
	output   []string
}

// tally is what a phase saw of one test.
type tally struct {
	runs, failed int
	failures     []failure // the first maxKept
	current      []string  // the output of the run in progress
	messages     []string  // the run in progress's reports, the first maxMessages
}

// reported matches the first line of a test's report: its file and line.
var reported = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: `)

// maxMessages bounds the reports kept of a failed run.
const maxMessages = 12

// maxKept bounds the distinct failures kept per test, maxLines the lines
// kept of each (its last ones: the failure is at the end) and maxWidth
// the characters printed of a line (a test may log a whole state).
const (
	maxKept  = 3
	maxLines = 60
	maxWidth = 400
)

// report is what a phase's `go test -json` stream says: runs and failures
// per test.
type report struct {
	tests map[testID]*tally
	// pkgTail are the last lines each package printed, whatever test
	// printed them: a package that fails outside any test (a panic in a
	// goroutine, a timeout) is known by them.
	pkgTail map[string][]string
	// unparsed counts lines that were not test2json events (go vet's or
	// the build's output before a package's first event).
	unparsed []string
}

// read consumes a `go test -json` stream until it ends, copying every
// line to raw (the phase's log) when raw is not nil.
func read(r io.Reader, raw io.Writer) (*report, error) {
	rep := &report{tests: map[testID]*tally{}, pkgTail: map[string][]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if raw != nil {
			if _, err := raw.Write(append(line, '\n')); err != nil {
				return nil, fmt.Errorf("writing the raw log: %w", err)
			}
		}
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			rep.unparsed = append(rep.unparsed, string(line))
			continue
		}
		rep.add(e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading go test's output: %w", err)
	}
	return rep, nil
}

// add records one event.
func (rep *report) add(e event) {
	id := testID{e.Package, e.Test}
	t := rep.tests[id]
	if t == nil {
		t = &tally{}
		rep.tests[id] = t
	}
	switch e.Action {
	case "run", "start":
		t.current, t.messages = t.current[:0], t.messages[:0]
	case "output":
		line := strings.TrimRight(e.Output, "\n")
		t.current = append(t.current, line)
		if len(t.messages) < maxMessages && reported.MatchString(line) {
			t.messages = append(t.messages, line)
		}
		if rep.pkgTail != nil {
			rep.pkgTail[e.Package] = append(rep.pkgTail[e.Package], line)
			if n := len(rep.pkgTail[e.Package]); n > maxLines {
				rep.pkgTail[e.Package] = rep.pkgTail[e.Package][n-maxLines:]
			}
		}
		if len(t.current) > 4*maxLines {
			t.current = append(t.current[:0], t.current[len(t.current)-maxLines:]...)
		}
	case "pass":
		t.runs++
		t.current, t.messages = t.current[:0], t.messages[:0]
	case "fail":
		t.runs++
		t.failed++
		lines := t.current
		if e.Test == "" && len(rep.pkgTail[e.Package]) > 0 {
			lines = rep.pkgTail[e.Package] // the package's own output says only FAIL
		}
		if len(lines) > maxLines {
			lines = lines[len(lines)-maxLines:]
		}
		if len(t.failures) < maxKept && !t.seen(lines) {
			t.failures = append(t.failures, failure{messages: slices.Clone(t.messages), output: slices.Clone(lines)})
		}
		t.current, t.messages = t.current[:0], t.messages[:0]
	}
}

// seen reports whether a kept failure printed lines.
func (t *tally) seen(lines []string) bool {
	return slices.ContainsFunc(t.failures, func(f failure) bool { return slices.Equal(f.output, lines) })
}

// failedTests are the tests that failed at least once, sorted by name.
func (rep *report) failedTests() []testID {
	var out []testID
	for id, t := range rep.tests {
		if t.failed > 0 {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(a, b testID) int {
		return strings.Compare(a.Package+"\x00"+a.Test, b.Package+"\x00"+b.Test)
	})
	return out
}

// runs counts the runs of tests (not packages) the phase saw.
func (rep *report) runs() (runs, tests int) {
	for id, t := range rep.tests {
		if id.Test != "" {
			runs += t.runs
			tests++
		}
	}
	return runs, tests
}

// write prints the phase's summary: its counts, then every test that
// failed at least once, with the output of its first failures.
func (rep *report) write(w io.Writer, phase string) {
	runs, tests := rep.runs()
	failed := rep.failedTests()
	fmt.Fprintf(w, "flake: %s: %d runs of %d tests, %d tests failed at least once\n", phase, runs, tests, len(failed))
	for _, id := range failed {
		t := rep.tests[id]
		fmt.Fprintf(w, "FAIL %s: %d of %d runs\n", id, t.failed, t.runs)
		for i, f := range t.failures {
			fmt.Fprintf(w, "  --- distinct failure %d of %d shown:\n", i+1, len(t.failures))
			if slices.ContainsFunc(f.messages, func(m string) bool { return !slices.Contains(f.output, m) }) { // cut from the last lines
				fmt.Fprintf(w, "  what the test reported:\n")
				for _, l := range f.messages {
					fmt.Fprintf(w, "    %s\n", clip(l))
				}
				fmt.Fprintf(w, "  its last lines:\n")
			}
			for _, l := range f.output {
				fmt.Fprintf(w, "    %s\n", clip(l))
			}
		}
	}
	if len(failed) == 0 && len(rep.unparsed) > 0 && runs == 0 {
		// No test ran: the build's or vet's output says why.
		fmt.Fprintf(w, "flake: %s ran no test; go test said:\n", phase)
		for _, l := range rep.unparsed[max(0, len(rep.unparsed)-maxLines):] {
			fmt.Fprintf(w, "    %s\n", clip(l))
		}
	}
}

// clip cuts a line to maxWidth characters, saying how much it left out.
func clip(l string) string {
	if len(l) <= maxWidth {
		return l
	}
	return fmt.Sprintf("%s… (%d more characters in the raw log)", l[:maxWidth], len(l)-maxWidth)
}
