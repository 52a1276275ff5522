package deploycheck

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

// Docker Compose cannot run here (no Docker daemon, no registry), so the
// compose example is checked without running it: compose-go, the loader
// docker compose itself uses, loads it with its JSON-schema validation,
// interpolation and consistency checks; every bind-mounted file exists;
// tokentap's config passes the sidecar's own --config.check; the
// Prometheus config (with the shipped rules) passes `promtool check
// config`; Grafana's provisioning files decode strictly.
func TestComposeExample(t *testing.T) {
	dir, _ := filepath.Abs(filepath.Join(root, "deploy/compose"))
	load := func(profiles ...string) *types.Project {
		t.Helper()
		opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yaml")},
			cli.WithWorkingDirectory(dir), cli.WithEnv([]string{}), cli.WithProfiles(profiles), cli.WithConsistency(true))
		if err != nil {
			t.Fatal(err)
		}
		p, err := opts.LoadProject(context.Background())
		if err != nil {
			t.Fatalf("compose-go rejects deploy/compose/compose.yaml (profiles %v): %v", profiles, err)
		}
		return p
	}
	p := load()
	want := []string{"grafana", "ollama", "ollama-pull", "prometheus", "tokentap"}
	if got := strings.Join(p.ServiceNames(), ","); got != strings.Join(want, ",") {
		t.Errorf("services %s, want %s", got, strings.Join(want, ","))
	}
	if v := load("vllm"); len(v.ServiceNames()) != len(want)+1 {
		t.Errorf("with --profile vllm: %v", v.ServiceNames())
	}

	tt := p.Services["tokentap"]
	if tt.Build == nil || tt.Build.Target != "runtime" || filepath.Clean(tt.Build.Context) != filepath.Clean(filepath.Join(dir, "../..")) {
		t.Errorf("tokentap build: %+v", tt.Build)
	}
	args := strings.Join(tt.Command, " ")
	for _, w := range []string{"--upstream=http://ollama:11434", "--upstream-health-path=/", "--admin-listen=0.0.0.0:9464", "--config=/etc/tokentap/tokentap.yaml"} {
		if !strings.Contains(args, w) {
			t.Errorf("tokentap command %q lacks %s", args, w)
		}
	}
	// Every bind mount's source exists.
	for name, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeBind {
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("service %s mounts %s: %v", name, v.Source, err)
				}
			}
		}
	}
	// tokentap's own validation of its config file.
	b, err := os.ReadFile(filepath.Join(dir, "tokentap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, "deploy/compose/tokentap.yaml", string(b))

	// promtool, with the rules path of the container pointed at the repo's.
	promtool := need(t, "promtool")
	cfg, _ := os.ReadFile(filepath.Join(dir, "prometheus.yml"))
	rules, _ := filepath.Abs(filepath.Join(root, "deploy/prometheus/tokentap-rules.yaml"))
	if !strings.Contains(string(cfg), "/etc/prometheus/rules/tokentap-rules.yaml") {
		t.Fatal("prometheus.yml does not load the rules where compose.yaml mounts them")
	}
	tmp := filepath.Join(t.TempDir(), "prometheus.yml")
	os.WriteFile(tmp, []byte(strings.ReplaceAll(string(cfg), "/etc/prometheus/rules/tokentap-rules.yaml", rules)), 0o644)
	if out, err := exec.Command(promtool, "check", "config", tmp).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	} else {
		t.Logf("promtool check config: %s", strings.TrimSpace(string(out)))
	}

	// Grafana provisioning: a Prometheus datasource and a file provider
	// whose path is where compose.yaml mounts dashboards/.
	var ds struct {
		APIVersion  int `json:"apiVersion"`
		Datasources []struct {
			Name      string         `json:"name"`
			UID       string         `json:"uid"`
			Type      string         `json:"type"`
			Access    string         `json:"access"`
			URL       string         `json:"url"`
			IsDefault bool           `json:"isDefault"`
			JSONData  map[string]any `json:"jsonData"`
		} `json:"datasources"`
	}
	strict(t, filepath.Join(dir, "grafana/provisioning/datasources/prometheus.yaml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
		t.Errorf("datasource %+v", ds)
	}
	var prov struct {
		APIVersion int `json:"apiVersion"`
		Providers  []struct {
			Name            string `json:"name"`
			Folder          string `json:"folder"`
			Type            string `json:"type"`
			DisableDeletion bool   `json:"disableDeletion"`
			AllowUIUpdates  bool   `json:"allowUiUpdates"`
			Options         struct {
				Path                      string `json:"path"`
				FoldersFromFilesStructure bool   `json:"foldersFromFilesStructure"`
			} `json:"options"`
		} `json:"providers"`
	}
	strict(t, filepath.Join(dir, "grafana/provisioning/dashboards/tokentap.yaml"), &prov)
	mounted := false
	for _, v := range p.Services["grafana"].Volumes {
		if len(prov.Providers) == 1 && v.Target == prov.Providers[0].Options.Path && filepath.Clean(v.Source) == filepath.Clean(filepath.Join(dir, "../../dashboards")) {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("Grafana's dashboard provider path %+v is not where compose.yaml mounts dashboards/", prov)
	}
	home := p.Services["grafana"].Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
	if home == nil || !strings.HasPrefix(*home, prov.Providers[0].Options.Path+"/") {
		t.Errorf("home dashboard %v", home)
	} else if _, err := os.Stat(filepath.Join(root, "dashboards", filepath.Base(*home))); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
	out, _ := json.Marshal(p.ServiceNames())
	t.Logf("compose.yaml loads with compose-go (schema, interpolation, consistency): services %s", out)
}

func strict(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Errorf("%s: %v", path, err)
	}
}
