package agent

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestLogsHandler: a replica's log is read by its tag, its last lines or
// what follows an offset (the next offset in the answer's header); a log
// rotated under a reader is read from its start; anything but a tag, or a
// log this node has not, is refused without touching another path.
func TestLogsHandler(t *testing.T) {
	dir := t.TempDir()
	replicaLog := filepath.Join(dir, wire.ReplicaServiceID("model-v1#00aa11")+".log")
	envoyLog := filepath.Join(dir, "envoy.log")
	write := func(path, text string) {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(replicaLog, "one\ntwo\nthree\n")
	write(envoyLog, "starting envoy\n")
	srv := httptest.NewServer(LogsHandler(dir, envoyLog))
	defer srv.Close()
	get := func(query string) (int, string, string) {
		t.Helper()
		status, header, body := testutil.Get(t, srv.URL+wire.LogsPath+"?"+query)
		return status, body, header.Get(wire.LogOffsetHeader)
	}
	for _, c := range []struct {
		query, body, offset string
		status              int
	}{
		{"replica=model-v1%2300aa11&tail=2", "two\nthree\n", "14", 200},
		{"replica=model-v1%2300aa11", "one\ntwo\nthree\n", "14", 200},
		{"replica=model-v1%2300aa11&offset=4", "two\nthree\n", "14", 200},
		{"replica=model-v1%2300aa11&offset=14", "", "14", 200},
		{"replica=model-v1%2300aa11&offset=99", "one\ntwo\nthree\n", "14", 200}, // rotated: from the start
		{"envoy=true&tail=1", "starting envoy\n", "15", 200},
		{"replica=../../etc/passwd", "", "", 400},
		{"replica=model-v1%23ffffff", "", "", 404},
		{"replica=model-v1%2300aa11&tail=-1", "", "", 400},
		{"replica=model-v1%2300aa11&tail=10001", "", "", 400},
	} {
		status, body, offset := get(c.query)
		if status != c.status || (status == 200 && (body != c.body || offset != c.offset)) {
			t.Errorf("?%s: %d %q offset %q; want %d %q offset %q", c.query, status, body, offset, c.status, c.body, c.offset)
		}
	}
	if _, body, _ := get("replica=.."); !strings.Contains(body, "name a replica by its tag") {
		t.Errorf("a bad tag's answer: %q", body)
	}
}
