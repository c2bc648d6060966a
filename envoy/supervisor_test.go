package envoy

import (
	"strings"
	"testing"
)

// TestCrashCauseIsTheBugNotTheBacktrace: a crashed Envoy's log ends in a
// backtrace and a dump of what it was doing; the cause logged is the
// line that says what went wrong, and the few after it.
func TestCrashCauseIsTheBugNotTheBacktrace(t *testing.T) {
	log := strings.Join([]string{
		"[2026-12-06 05:01:42.300][1][info][upstream] cds: added/updated 2 cluster(s)",
		"[2026-12-06 05:01:42.363][1][error][envoy_bug] [./source/common/listener_manager/listener_impl.cc:1] envoy bug failure: the listener's socket is gone.",
		"[2026-12-06 05:01:42.363][1][error][envoy_bug] [./source/common/common/assert.h:66] stacktrace for envoy bug",
		"[2026-12-06 05:01:42.363][1][error][envoy_bug] [./source/common/common/assert.h:66] #0 UNKNOWN [0x55f07094cbcc]",
		"[2026-12-06 05:01:42.363][1][error][envoy_bug] [./source/common/common/assert.h:66] #1 UNKNOWN [0x55f07094cbcc]",
		"[2026-12-06 05:01:42.363][1][critical][backtrace] [./source/server/backtrace.h:173] Caught Aborted, suspect faulting address 0x296b",
	}, "\n")
	got := crashCause(log)
	if !strings.HasPrefix(got, "[2026-12-06 05:01:42.363][1][error][envoy_bug] [./source/common/listener_manager/listener_impl.cc:1] envoy bug failure: the listener's socket is gone.") ||
		strings.Count(got, "\n") != 3 {
		t.Fatalf("crashCause = %q; want the envoy bug's line and the three after it", got)
	}
	if got := crashCause("[info] all well\n"); got != "" {
		t.Fatalf("crashCause of a log with no crash = %q; want none", got)
	}
}
