package slo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tokentap/tokentap/internal/testtool"
)

// The shipped files are exactly what the generator writes.
func TestShippedRulesAreGenerated(t *testing.T) {
	plain, err := PlainRules(RuleParams{})
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := PrometheusRuleManifest(RuleParams{})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string][]byte{
		"../deploy/prometheus/tokentap-rules.yaml": plain,
		"../deploy/kubernetes/prometheusrule.yaml": manifest,
	} {
		got, err := os.ReadFile(file)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale or missing (%v): run go run ./deploy/rulegen", file, err)
		}
	}
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool := testtool.Need(t, "promtool")
	// The PrometheusRule's spec is a rules file: check it too.
	b, err := os.ReadFile("../deploy/kubernetes/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Spec yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	spec, _ := yaml.Marshal(&m.Spec)
	specFile := filepath.Join(t.TempDir(), "spec.yaml")
	os.WriteFile(specFile, spec, 0o644)
	scaled, _ := PlainRules(RuleParams{Scale: 120})
	scaledFile := filepath.Join(t.TempDir(), "scaled.yaml")
	os.WriteFile(scaledFile, scaled, 0o644)
	for _, f := range []string{"../deploy/prometheus/tokentap-rules.yaml", specFile, scaledFile} {
		out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("SUCCESS: 141 rules found")) {
			t.Errorf("promtool check rules %s: %v\n%s", f, err, out)
		}
	}
}

// promtool test rules runs the unit tests in deploy/prometheus/tests:
// attainment and bound values, a fast burn firing within its window, a
// slow burn, no alert on a short blip, no alert on thin evidence.
func TestPromtoolTestRules(t *testing.T) {
	promtool := testtool.Need(t, "promtool")
	files, _ := filepath.Glob("../deploy/prometheus/tests/*.yaml")
	if len(files) == 0 {
		t.Fatal("no rule tests found")
	}
	out, err := exec.Command(promtool, append([]string{"test", "rules"}, files...)...).CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("FAILED")) {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
