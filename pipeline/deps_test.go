package pipeline_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The data path (proxy, stream, record, pipeline) compiles without the
// GPU library, gRPC and the OpenTelemetry SDK: the pipeline reaches them
// only through the stage interfaces it declares, wired in package app
// (docs/design.md, "Packages and their direction").
func TestDataPathCompilesAlone(t *testing.T) {
	// go test puts its own GOROOT/bin first on the PATH.
	out, err := exec.Command("go", "list", "-deps",
		"github.com/tokentap/tokentap/proxy", "github.com/tokentap/tokentap/stream",
		"github.com/tokentap/tokentap/record", "github.com/tokentap/tokentap/pipeline").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/tokentap/tokentap/proxy") {
		t.Fatalf("go list -deps listed %d packages, the proxy not among them", len(deps))
	}
	for _, d := range deps {
		for _, banned := range []string{"github.com/NVIDIA/go-nvml", "google.golang.org/grpc", "go.opentelemetry.io/otel/sdk"} {
			if d == banned || strings.HasPrefix(d, banned+"/") {
				t.Errorf("the data path depends on %s", d)
			}
		}
	}
	t.Logf("%d packages", len(deps))
}
