package enginetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// /readyz is 200 in front of Ollama with no health-path setting: the
// default check must find an endpoint Ollama serves (Ollama has no
// /health; issue 11, item 4).
func TestReadyzInFrontOfOllama(t *testing.T) {
	w := setup(t)
	s := startSidecar(t, w)
	var status int
	var body []byte
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if status = resp.StatusCode; status == 200 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if status != 200 {
		t.Fatalf("/readyz = %d %s after 10 s, want 200", status, body)
	}
	t.Logf("/readyz: %d %s", status, strings.TrimSpace(string(body)))
}

// An unknown model: Ollama answers 404 with a JSON body on every API; the
// client gets exactly Ollama's answer and the record says http_4xx
// (docs/metrics.md), with outcome error.
func TestUnknownModelIsHTTP4xx(t *testing.T) {
	w := setup(t)
	s := startSidecar(t, w)
	for _, c := range []struct{ name, path, body string }{
		{"ollama_chat", "/api/chat", `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`},
		{"ollama_generate", "/api/generate", `{"model":"no-such-model","prompt":"hi"}`},
		{"chat", "/v1/chat/completions", `{"model":"no-such-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"completions", "/v1/completions", `{"model":"no-such-model","stream":true,"prompt":"hi"}`},
		{"responses", "/v1/responses", `{"model":"no-such-model","stream":true,"input":"hi"}`},
		{"messages", "/v1/messages", `{"model":"no-such-model","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct := post(t, w.ollama, c.path, c.body, nil)
			via := post(t, s.proxy, c.path, c.body, nil)
			r := s.next(t)
			if direct.status != 404 || !json.Valid(direct.body) {
				t.Fatalf("direct: %d %s, want a JSON 404 (the premise of this test)", direct.status, direct.body)
			}
			if via.status != direct.status || string(mask(via.body)) != string(mask(direct.body)) {
				t.Errorf("through the sidecar %d %q, direct %d %q", via.status, via.body, direct.status, direct.body)
			}
			t.Logf("engine: %d %s; record: %s", direct.status, strings.TrimSpace(string(direct.body)), r)
			if r.HTTPStatus != 404 || r.Outcome != "error" || r.ErrorType != "http_4xx" {
				t.Errorf("record http_status %d outcome %q error_type %q, want 404 error http_4xx", r.HTTPStatus, r.Outcome, r.ErrorType)
			}
			if r.API != c.name {
				t.Errorf("record api %q, want %q", r.API, c.name)
			}
		})
	}
}

// A canary probe on each API succeeds against Ollama (docs/probe.md): its
// records say success, and Ollama's answer passes the probe's checks.
// The probe config names the API; until the probes speak an API, the
// sidecar refuses the config and this subtest fails with its message.
func TestCanaryProbeOnEachAPI(t *testing.T) {
	w := setup(t)
	for _, api := range []string{"chat", "completions", "responses", "messages", "ollama_chat", "ollama_generate"} {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/stream=%v", api, stream), func(t *testing.T) {
				cfg := filepath.Join(t.TempDir(), "probes.yaml")
				yaml := fmt.Sprintf(`probes:
  probes:
    - name: canary
      api: %s
      stream: %v
      model: %s
      prompt: "Say something."
      max_tokens: 8
      temperature: 0
      seed: %d
      interval: 300ms
      timeout: 10s
      target: upstream
      expect:
        output_tokens_min: 8
        output_tokens_max: 8
`, api, stream, modelName, seed)
				if api == "chat" || api == "completions" {
					yaml += "        finish_reason: length\n"
				}
				if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
					t.Fatal(err)
				}
				if out, err := checkConfig(w, cfg); err != nil {
					t.Fatalf("the sidecar refuses this probe config (%v):\n%s", err, out)
				}
				s := startSidecar(t, w, "--config", cfg)
				var got []rec
				deadline := time.Now().Add(15 * time.Second)
				for len(got) < 3 && time.Now().Before(deadline) {
					got = got[:0]
					for _, r := range s.all(t) {
						if r.Traffic == "canary" && r.Probe != nil && r.Outcome != "not_sent" {
							got = append(got, r)
						}
					}
					time.Sleep(100 * time.Millisecond)
				}
				if len(got) < 3 {
					t.Fatalf("%d probe records after 15 s, want 3:\n%s", len(got), s.log())
				}
				for _, r := range got[:3] {
					if r.Probe.Result != "success" {
						t.Errorf("probe %s (check %q: %s); record %s", r.Probe.Result, r.Probe.FailedCheck, r.Probe.Failure, r)
					}
				}
				r := got[0]
				t.Logf("probe record: api %s outcome %s output_tokens %v ttft_ms %v e2e_ms %v", r.API, r.Outcome, deref(r.OutputTokens), fderef(r.TTFTms), fderef(r.E2Ems))
			})
		}
	}
}

func checkConfig(w *world, cfg string) (string, error) {
	cmd := execCommand(w.sidecar, "--upstream", w.ollama, "--config", cfg, "--config.check")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func fderef(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
