package slo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

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
		if err != nil || !bytes.Contains(out, []byte("SUCCESS: 146 rules found")) {
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

// Every alert's runbook annotation points at a section that exists: a
// heading of the file it names whose anchor (GitHub's: lower case, spaces
// to hyphens, punctuation dropped) is the link's fragment.
func TestAlertRunbooksExist(t *testing.T) {
	anchors := map[string]map[string]bool{}
	n := 0
	for _, g := range Rules(RuleParams{}).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			file, frag, ok := strings.Cut(r.Annotations["runbook"], "#")
			if !ok || frag == "" {
				t.Errorf("%s: runbook %q names no section", r.Alert, r.Annotations["runbook"])
				continue
			}
			if anchors[file] == nil {
				b, err := os.ReadFile(filepath.Join("..", file))
				if err != nil {
					t.Fatalf("%s: %v", r.Alert, err)
				}
				anchors[file] = map[string]bool{}
				for _, line := range strings.Split(string(b), "\n") {
					if h, ok := strings.CutPrefix(line, "#"); ok {
						anchors[file][githubAnchor(strings.TrimLeft(h, "#"))] = true
					}
				}
			}
			if !anchors[file][frag] {
				t.Errorf("%s: %s has no section #%s", r.Alert, file, frag)
			}
		}
	}
	if n < 17 {
		t.Fatalf("%d alerts read, want every shipped one", n)
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case c == ' ':
			b.WriteByte('-')
		case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c):
			b.WriteRune(c)
		}
	}
	return b.String()
}
