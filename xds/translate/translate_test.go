package translate

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/out and delete orphaned ones")

// goldenNode is the node every golden case is translated for.
var goldenNode = Node{ID: "node-1", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001}

// goldenOutputs renders one input case to its output files: the four resource
// kinds for a valid model, or the error text for an invalid one.
func goldenOutputs(t *testing.T, input []byte) map[string][]byte {
	t.Helper()
	m, err := model.Parse(input)
	var res *Resources
	if err == nil {
		res, err = Translate(m, goldenNode)
	}
	if err != nil {
		return map[string][]byte{"error.txt": []byte(err.Error() + "\n")}
	}
	checkEnvoyValid(t, res)
	out := map[string][]byte{}
	for kind, render := range map[string]func() ([]byte, error){
		"listeners": func() ([]byte, error) { return protoyaml.MarshalList(res.Listeners) },
		"routes":    func() ([]byte, error) { return protoyaml.MarshalList(res.Routes) },
		"clusters":  func() ([]byte, error) { return protoyaml.MarshalList(res.Clusters) },
		"endpoints": func() ([]byte, error) { return protoyaml.MarshalList(res.Endpoints) },
	} {
		b, err := render()
		if err != nil {
			t.Fatalf("render %s: %v", kind, err)
		}
		out[kind+".yaml"] = b
	}
	return out
}

// checkEnvoyValid runs Envoy's own proto validation rules on every resource
// and go-control-plane's snapshot consistency check on the whole set.
func checkEnvoyValid(t *testing.T, res *Resources) {
	t.Helper()
	all := map[resource.Type][]types.Resource{}
	add := func(typ resource.Type, msgs ...proto.Message) {
		for _, m := range msgs {
			if v, ok := m.(interface{ ValidateAll() error }); ok {
				if err := v.ValidateAll(); err != nil {
					t.Errorf("%s fails Envoy's validation: %v", typ, err)
				}
			}
			all[typ] = append(all[typ], m)
		}
	}
	for _, r := range res.Listeners {
		add(resource.ListenerType, r)
	}
	for _, r := range res.Routes {
		add(resource.RouteType, r)
	}
	for _, r := range res.Clusters {
		add(resource.ClusterType, r)
	}
	for _, r := range res.Endpoints {
		add(resource.EndpointType, r)
	}
	snap, err := cachev3.NewSnapshot("1", all)
	if err != nil {
		t.Fatalf("new snapshot: %v", err)
	}
	if err := snap.Consistent(); err != nil {
		t.Errorf("snapshot is not consistent: %v", err)
	}
}

func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/in/*.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden inputs found in testdata/in (err %v)", err)
	}
	wanted := map[string]bool{}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			input, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			for suffix, got := range goldenOutputs(t, input) {
				path := filepath.Join("testdata", "out", name+"."+suffix)
				wanted[path] = true
				testutil.Golden(t, path, got, *update)
			}
		})
	}
	outputs, _ := filepath.Glob("testdata/out/*")
	sort.Strings(outputs)
	for _, out := range outputs {
		if wanted[out] {
			continue
		}
		if *update {
			if err := os.Remove(out); err != nil {
				t.Fatal(err)
			}
			t.Logf("removed orphaned golden file %s", out)
		} else {
			t.Errorf("orphaned golden file %s has no input case; run `make testdata` to remove it", out)
		}
	}
}
