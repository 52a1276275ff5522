package app

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tenants' acceptance (issue 23), once per identity source: three
// declared tenants and 50 random tenant values (API keys, or values of
// the tenant header), each sent by a client through the sidecar in front
// of its simulator, with an SLO whose verdict each request's max_tokens
// decides (min_output_tokens 5: 3 tokens miss it, 6 meet it).
//
//   - /metrics has at most max_tenants + 2 tenant label values;
//   - /slo's row of each tenant (JSON) is the count of the records'
//     verdicts of that tenant, and the HTML page shows each row;
//   - no API key, no header value and not the hash's secret appears in
//     any output (the records file, the log at debug level, /metrics,
//     the spans and metrics sent over OTLP, /slo as JSON and HTML, the
//     live page's data);
//     the declared names do.
func TestTenantsAcceptance(t *testing.T) {
	for _, from := range []string{"api_key", "header"} {
		t.Run(from, func(t *testing.T) { tenantsAcceptance(t, from) })
	}
}

func tenantsAcceptance(t *testing.T, from string) {
	const (
		maxTenants = 10
		random     = 50
		secret     = "tenant-test-secret-0123456789abcdef"
	)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "tenant.key")
	os.WriteFile(keyFile, []byte(secret+"\n"), 0o600)
	hash := func(v string) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(v))
		return hex.EncodeToString(m.Sum(nil))
	}
	rnd := func(prefix string) string {
		b := make([]byte, 12)
		rand.Read(b)
		return prefix + hex.EncodeToString(b)
	}
	declared := map[string]string{} // name → its key or header value
	var match strings.Builder
	for _, name := range []string{"acme", "beta", "gamma"} {
		v := rnd("sk-" + name + "-")
		declared[name] = v
		m := hash(v)
		if from == "header" {
			m = v
		}
		fmt.Fprintf(&match, "    - name: %s\n      match: [%q]\n", name, m)
	}
	header := ""
	if from == "header" {
		header = "  header: X-Tenant\n"
	}
	cfg := fmt.Sprintf(`log_level: debug
slo:
  objectives:
    - name: chat
      target: 0.5
      thresholds: {min_output_tokens: 5}
tenant:
  from: %s
%s  max_tenants: %d
  hash_key_file: %s
  tenants:
%s`, from, header, maxTenants, keyFile, match.String())

	sink := &otlpSink{} // structure_sinks_test.go
	otlp := httptest.NewServer(sink)
	defer otlp.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	logs := &lockedBuffer{}
	cfgFile := filepath.Join(dir, "tokentap.yaml")
	os.WriteFile(cfgFile, []byte(cfg), 0o644)
	a, records := startSidecarEnv(t, "", func(e *Env) { withOSEnv(e); e.Stderr = logs },
		"--config", cfgFile, "--sim.eos-prob", "0", "--energy", "off")

	// The requests: each random value once, each declared tenant 4 times,
	// 3 with no identity; max_tokens 3 or 6 at random.
	var values []string // every key or header value sent
	type req struct{ value, tenant string }
	var reqs []req
	for range random {
		v := rnd("sk-rnd-")
		values = append(values, v)
		reqs = append(reqs, req{value: v})
	}
	for name, v := range declared {
		values = append(values, v)
		for range 4 {
			reqs = append(reqs, req{value: v, tenant: name})
		}
	}
	for range 3 {
		reqs = append(reqs, req{tenant: "_none"})
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, rq := range reqs {
		maxTokens := 3
		if b := make([]byte, 1); true {
			rand.Read(b)
			if b[0]&1 == 1 {
				maxTokens = 6
			}
		}
		body := fmt.Sprintf(`{"model":"sim","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"request %d"}]}`, maxTokens, i)
		r, _ := http.NewRequest("POST", "http://"+a.Proxy+"/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if rq.value != "" {
			if from == "header" {
				r.Header.Set("X-Tenant", rq.value)
			} else {
				r.Header.Set("Authorization", "Bearer "+rq.value)
			}
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()

	// The records' verdicts, by tenant.
	type verdicts struct{ offered, qualified int64 }
	byTenant := map[string]*verdicts{}
	var raw []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		raw, _ = os.ReadFile(records)
		clear(byTenant)
		n := 0
		for _, l := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
			var r struct {
				Traffic string `json:"traffic"`
				Tenant  string `json:"tenant"`
				SLO     []struct {
					Name      string `json:"name"`
					Qualified bool   `json:"qualified"`
					Excluded  bool   `json:"excluded"`
				} `json:"slo"`
			}
			if json.Unmarshal(l, &r) != nil || r.Traffic != "live" {
				continue
			}
			n++
			if r.Tenant == "" {
				t.Fatalf("a live record without a tenant: %s", l)
			}
			v := byTenant[r.Tenant]
			if v == nil {
				v = &verdicts{}
				byTenant[r.Tenant] = v
			}
			for _, s := range r.SLO {
				if s.Name == "chat" && !s.Excluded {
					v.offered++
					if s.Qualified {
						v.qualified++
					}
				}
			}
		}
		if n == len(reqs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live records, want %d", n, len(reqs))
		}
	}
	for name := range declared {
		if byTenant[name] == nil || byTenant[name].offered != 4 {
			t.Errorf("declared tenant %s: %+v in the records, want 4 offered", name, byTenant[name])
		}
	}
	if byTenant["_none"] == nil || byTenant["_none"].offered != 3 {
		t.Errorf("_none: %+v, want 3 offered", byTenant["_none"])
	}

	// /metrics: at most max_tenants + 2 tenant label values.
	metrics := get(t, "http://"+a.Admin+"/metrics")
	labels := map[string]bool{}
	for _, m := range regexp.MustCompile(`[{,]tenant="([^"]*)"`).FindAllStringSubmatch(string(metrics), -1) {
		labels[m[1]] = true
	}
	var names []string
	for l := range labels {
		names = append(names, l)
	}
	sort.Strings(names)
	t.Logf("%d tenant label values on /metrics (max_tenants %d + 2 = %d): %v", len(labels), maxTenants, maxTenants+2, names)
	if len(labels) > maxTenants+2 || !labels["_other"] || !labels["_none"] || !labels["acme"] {
		t.Errorf("%d tenant label values on /metrics, want at most %d with _other, _none and the declared: %v", len(labels), maxTenants+2, names)
	}

	// /slo: each tenant's row is its records' verdicts.
	page := sloPage(t, a.Admin)
	rows := page.SLOs[0].Tenants
	if len(rows) != len(byTenant) {
		t.Errorf("/slo has %d tenant rows, the records %d tenants", len(rows), len(byTenant))
	}
	for _, row := range rows {
		v := byTenant[row.Tenant]
		if v == nil || row.Offered != v.offered || row.Qualified != v.qualified {
			t.Errorf("/slo tenant %s: %d of %d qualified; the records: %+v", row.Tenant, row.Qualified, row.Offered, v)
			continue
		}
		if a := float64(v.qualified) / float64(v.offered); row.Attainment == nil || *row.Attainment != a {
			t.Errorf("/slo tenant %s: attainment %v, the records' %v", row.Tenant, row.Attainment, a)
		}
	}
	t.Logf("/slo: %d tenant rows, each equal to its records' verdicts", len(rows))
	sloJSON := get(t, "http://"+a.Admin+"/slo?format=json")
	sloHTML := get(t, "http://"+a.Admin+"/slo")
	if !bytes.Contains(sloHTML, []byte("chat by tenant")) {
		t.Error("/slo's HTML has no tenant table")
	}

	// The spans and OTLP metrics arrive (the batch and the export
	// interval are short); then every sink is searched.
	arrived := func(b []byte) bool {
		return bytes.Contains(b, []byte("tokentap.tenant")) && bytes.Contains(b, []byte("acme"))
	}
	traces, otlpMetrics := sink.bytes()
	for deadline := time.Now().Add(10 * time.Second); !arrived(traces) || !arrived(otlpMetrics); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no tokentap.tenant in the OTLP spans (%d bytes) or metrics (%d bytes)", len(traces), len(otlpMetrics))
		}
		traces, otlpMetrics = sink.bytes()
	}
	sinks := map[string][]byte{"records": raw, "log": []byte(logs.String()), "/metrics": metrics, "OTLP spans": traces,
		"OTLP metrics": otlpMetrics, "/slo JSON": sloJSON, "/slo HTML": sloHTML,
		"/live/data": get(t, "http://"+a.Admin+"/live/data"), "/live/data?tenant=acme": get(t, "http://"+a.Admin+"/live/data?tenant=acme")}
	for where, b := range sinks {
		for _, v := range append(values, secret) {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s contains %q", where, v)
			}
		}
		if where != "log" && !bytes.Contains(b, []byte("acme")) {
			t.Errorf("%s does not name the declared tenant acme", where)
		}
	}
	t.Logf("searched %d sinks for %d values and the secret: none found", len(sinks), len(values))
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}
