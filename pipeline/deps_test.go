package pipeline_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The data path: the packages a request's bytes pass through.
var dataPath = []string{
	"github.com/tokentap/tokentap/proxy", "github.com/tokentap/tokentap/stream",
	"github.com/tokentap/tokentap/record", "github.com/tokentap/tokentap/pipeline",
}

// TestDataPathCompilesAlone: the data path (proxy, stream, record,
// pipeline) depends on the standard library, on itself and on the
// module's own internal/ packages, and on nothing else: no GPU library,
// gRPC, OpenTelemetry SDK or JSON Schema library (and none of what they
// bring, such as golang.org/x/text). It reaches them only through the
// interfaces it declares (the pipeline's stages, proxy.Tenants,
// proxy.Structure), wired in package app (docs/design.md, "Packages and
// their direction").
func TestDataPathCompilesAlone(t *testing.T) {
	// go test puts its own GOROOT/bin first on the PATH.
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}"}, dataPath...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var deps, std []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, standard, _ := strings.Cut(line, " ")
		deps = append(deps, path)
		switch {
		case standard == "true":
			std = append(std, path)
		case slices.Contains(dataPath, path), strings.HasPrefix(path, "github.com/tokentap/tokentap/internal/"):
		default:
			t.Errorf("the data path depends on %s: neither the standard library nor a data-path package", path)
		}
	}
	for _, p := range dataPath {
		if !slices.Contains(deps, p) {
			t.Fatalf("go list -deps listed %d packages, %s not among them", len(deps), p)
		}
	}
	t.Logf("%d packages: %d of the standard library, %d of the data path", len(deps), len(std), len(deps)-len(std))
}
