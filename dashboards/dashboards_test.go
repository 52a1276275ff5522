package dashboards

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// The files in the repository are exactly what `go run ./dashboards/gen`
// writes.
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := Generated("..")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(boards())+1 { // and the linter's configuration
		t.Fatalf("%d generated files", len(files))
	}
	var paths []string
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		have, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%v: run `go run ./dashboards/gen` from the repository root", err)
			continue
		}
		if !bytes.Equal(have, files[p]) {
			t.Errorf("%s differs from what dashboards/gen writes: run `go run ./dashboards/gen` from the repository root", p)
		}
	}
	// No stray dashboard that the generator no longer writes.
	found, _ := filepath.Glob(filepath.Join("..", Dir, "*.json"))
	for _, f := range found {
		if _, ok := files[f]; !ok {
			t.Errorf("%s is not generated: delete it", f)
		}
	}
	// Rendering twice gives the same bytes.
	a, _ := Render()
	b, _ := Render()
	for k := range a {
		if !bytes.Equal(a[k], b[k]) {
			t.Errorf("%s: rendering is not deterministic", k)
		}
	}
}

// jsonDashboard is the part of a dashboard's JSON the checks read.
type jsonDashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Editable   bool   `json:"editable"`
	Templating struct {
		List []struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			AllValue string `json:"allValue"`
			Query    any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []jsonPanel `json:"panels"`
}

type jsonPanel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

func readAll(t *testing.T) map[string]jsonDashboard {
	t.Helper()
	out := map[string]jsonDashboard{}
	for _, f := range Files() {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d jsonDashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = d
	}
	return out
}

// The dashboards decode into the SDK's own types (what Grafana's schema
// expects), are read-only, and every panel says what it plots and which
// definition it uses, has a unit, reads the datasource variable, and
// selects with the sidecar matchers (job and instance among them, as
// Grafana's dashboard linter asks) unless it reads a fleet recording
// rule, which the linter's configuration exempts.
func TestDashboardsAreComplete(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	cites := regexp.MustCompile(`docs/(measurement\.md §\d|metrics\.md|slo\.md|energy\.md|probe\.md|records-file\.md|design\.md|config\.md|engine-signals\.md|cost\.md)`)
	selector := regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)
	recorded := shippedRules(t)
	uids := map[string]bool{}
	panels, targets := 0, 0
	for f, d := range readAll(t) {
		b, _ := os.ReadFile(f)
		//lint:ignore SA1019 the v1 model is the one provisioning reads (see build)
		var typed dashboard.Dashboard
		if err := json.Unmarshal(b, &typed); err != nil {
			t.Errorf("%s does not decode into the SDK's Dashboard: %v", f, err)
		}
		if uids[d.UID] || d.UID == "" {
			t.Errorf("%s: uid %q empty or not unique", f, d.UID)
		}
		uids[d.UID] = true
		if d.Editable {
			t.Errorf("%s: editable, want read-only (a provisioned dashboard is regenerated)", f)
		}
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v.Type
			// job and instance are on every scraped series: All is .+
			// (the linter's template rules). The other labels may be
			// absent: All is .*, which matches them absent too.
			want := ".*"
			if v.Name == "job" || v.Name == "instance" {
				want = ".+"
			}
			if v.Type == "query" && v.AllValue != want {
				t.Errorf("%s: variable %s: All must be %s, got %q", f, v.Name, want, v.AllValue)
			}
		}
		for _, v := range []string{"datasource", "job", "namespace", "pod", "instance"} {
			if vars[v] == "" {
				t.Errorf("%s: no %s variable", f, v)
			}
		}
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			panels++
			where := f + ": " + p.Title
			if len(p.Description) < 60 || !cites.MatchString(p.Description) {
				t.Errorf("%s: the description must say what it plots and cite its definition (docs/measurement.md §N or docs/metrics.md …): %q", where, p.Description)
			}
			if p.FieldConfig.Defaults.Unit == "" {
				t.Errorf("%s: no unit", where)
			}
			if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("%s: datasource %q, %d targets", where, p.Datasource.UID, len(p.Targets))
			}
			for _, tg := range p.Targets {
				targets++
				if tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s %s: target datasource %q", where, tg.RefID, tg.Datasource.UID)
				}
				for _, v := range regexp.MustCompile(`\$(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
					if !strings.HasPrefix(v[1], "__") && vars[v[1]] == "" {
						t.Errorf("%s %s: uses $%s, which the dashboard does not define", where, tg.RefID, v[1])
					}
				}
				// A recording rule (level:metric:operations) aggregates the
				// fleet: it must be one that the shipped rules record, and
				// the description must say that the selectors do not
				// filter it.
				for _, name := range ruleName.FindAllString(tg.Expr, -1) {
					if !recorded[name] {
						t.Errorf("%s %s: %s is not recorded by %s", where, tg.RefID, name, rulesFile)
					}
					if !strings.Contains(p.Description, "do not filter") {
						t.Errorf("%s %s: recording rule %s needs a description that says the selectors do not filter it", where, tg.RefID, name)
					}
				}
				for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
					name, matchers := m[1], m[2]
					switch {
					case strings.HasPrefix(name, "slo_tenant:"):
						// A recording rule by SLO and tenant: both variables apply.
						if !strings.Contains(matchers, `slo=~"$slo"`) || !strings.Contains(matchers, `tenant=~"$tenant"`) {
							t.Errorf("%s %s: recording rule %s needs slo=~\"$slo\" and tenant=~\"$tenant\"", where, tg.RefID, name)
						}
					case strings.HasPrefix(name, "slo:") || strings.HasPrefix(name, "slo_load:"):
						// A recording rule by SLO: the SLO variable applies.
						if !strings.Contains(matchers, `slo=~"$slo"`) {
							t.Errorf("%s %s: recording rule %s needs slo=~\"$slo\"", where, tg.RefID, name)
						}
					case strings.Contains(name, ":"):
						// Any other recording rule has no sidecar labels.
					case !strings.Contains(matchers, sel):
						t.Errorf("%s %s: %s{%s} lacks the sidecar matchers %s", where, tg.RefID, name, matchers, sel)
					}
				}
			}
		}
	}
	t.Logf("%d dashboards, %d panels, %d queries", len(uids), panels, targets)
}

// rulesFile is the shipped rules file that the recording rules the
// dashboards read come from (generated by deploy/rulegen).
const rulesFile = "deploy/prometheus/tokentap-rules.yaml"

// ruleName finds recording-rule names (level:metric:operations) in a
// query.
var ruleName = regexp.MustCompile(`\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*[a-zA-Z0-9_]`)

// shippedRules returns the names that the shipped rules file records.
func shippedRules(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*- record: (\S+)$`).FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = true
	}
	if len(out) == 0 {
		t.Fatalf("%s records nothing", rulesFile)
	}
	return out
}

// The histogram helpers read native histograms first and classic
// buckets second, with the same labels on both sides.
func TestHistogramQueries(t *testing.T) {
	got := hq("0.9", "m", `a="b"`, "x")
	want := `histogram_quantile(0.9, sum by (x) (rate(m{a="b"}[$__rate_interval]))) or histogram_quantile(0.9, sum by (x, le) (rate(m_bucket{a="b"}[$__rate_interval])))`
	if got != want {
		t.Errorf("hq:\n got %s\nwant %s", got, want)
	}
	if q := quantiles("m", "", "", "", "0.5", "0.99", "0.999"); q[0].legend != "p50" || q[1].legend != "p99" || q[2].legend != "p999" {
		t.Errorf("legends %v", q)
	}
}
