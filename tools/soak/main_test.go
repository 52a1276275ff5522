package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMix(t *testing.T) {
	m := newMix("tokentap-sim", 64, 8, 0.25)
	tools, prev := 0, false
	auths := map[string]int{}
	for n := range uint64(1000) {
		body, auth, tool := m.request(n)
		var b struct {
			Model     string `json:"model"`
			Stream    bool   `json:"stream"`
			MaxTokens int    `json:"max_tokens"`
			Tools     []struct {
				Function struct {
					Name       string          `json:"name"`
					Parameters json.RawMessage `json:"parameters"`
				} `json:"function"`
			} `json:"tools"`
		}
		if err := json.Unmarshal([]byte(body), &b); err != nil {
			t.Fatalf("request %d: %v: %s", n, err, body)
		}
		if b.Model != "tokentap-sim" || !b.Stream || b.MaxTokens != 64 || (len(b.Tools) == 1) != tool {
			t.Fatalf("request %d: %+v, tool %v", n, b, tool)
		}
		if tool {
			tools++
			if prev {
				t.Errorf("requests %d and %d both declare a tool: not spread", n-1, n)
			}
			if !json.Valid(b.Tools[0].Function.Parameters) {
				t.Errorf("the tool's schema is not JSON")
			}
		}
		prev = tool
		auths[auth]++
	}
	if tools != 250 {
		t.Errorf("%d of 1000 declare a tool, want 250", tools)
	}
	if len(auths) != 8 || auths["Bearer soak-key-00"] != 125 || auths["Bearer soak-key-07"] != 125 {
		t.Errorf("keys: %v", auths)
	}
	none := newMix("m", 1, 0, 0)
	for n := range uint64(10) {
		if _, auth, tool := none.request(n); auth != "" || tool {
			t.Errorf("no keys, no tools: request %d has auth %q, tool %v", n, auth, tool)
		}
	}
	all := newMix("m", 1, 0, 1)
	for n := range uint64(10) {
		if _, _, tool := all.request(n); !tool {
			t.Errorf("share 1: request %d declares no tool", n)
		}
	}
}

func TestOTLPSink(t *testing.T) {
	s := &otlpSink{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	post := func(path, body string) int {
		resp, err := http.Post(srv.URL+path, "application/x-protobuf", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, body string
		code       int
	}{{"/v1/traces", "abcd", 200}, {"/v1/traces", "ef", 200}, {"/v1/metrics", "xyz", 200}, {"/v1/logs", "q", 404}} {
		if got := post(c.path, c.body); got != c.code {
			t.Errorf("POST %s: %d, want %d", c.path, got, c.code)
		}
	}
	resp, err := http.Get(srv.URL + "/v1/traces")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := otlpSummary{Traces: 2, Metrics: 1, TraceBytes: 6, MetricBytes: 3, Other: 2}
	if got := s.summary(); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
