package app

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The egress proxy wired into the sidecar (--egress-listen): a
// plain-HTTP forward request to an intercepted host goes through the same
// pipeline as the reverse proxy's (record file, /metrics); an intercepted
// HTTPS host whose certificate the system does not trust is refused and
// recorded as upstream_tls; a host:port on the tunnel allow-list is
// tunnelled and not recorded; the admin port is refused (403, counted on
// /metrics), by address and behind an intercepted name. Production
// dials and verifies as the system does, so the hosted API here is a
// loopback server named localhost, allowed by name
// (--egress-internal-allow).
func TestEgressWiredIntoTheSidecar(t *testing.T) {
	up := &scriptedUpstream{written: map[string][]time.Duration{}, cancelled: map[string]time.Duration{}}
	plain := httptest.NewServer(up)
	defer plain.Close()
	tlsUp := httptest.NewTLSServer(up) // its certificate is from httptest's own CA
	defer tlsUp.Close()
	dir := t.TempDir()
	tlsPort := strings.TrimPrefix(tlsUp.URL, "https://127.0.0.1:")
	a, recordsPath := startSidecar(t, plain.URL, "--egress-listen", "127.0.0.1:0", "--egress-intercept", "localhost",
		"--egress-internal-allow", "localhost,127.0.0.1", "--egress-tunnel-allow", "127.0.0.1:"+tlsPort,
		"--egress-ca-cert", filepath.Join(dir, "ca.pem"), "--egress-ca-key", filepath.Join(dir, "ca-key.pem"))
	if a.Egress == "" {
		t.Fatal("no egress address")
	}
	if st, err := os.Stat(filepath.Join(dir, "ca-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("generated CA key: %v %v", st, err)
	}
	proxyURL, _ := url.Parse("http://" + a.Egress)
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	pool.AppendCertsFromPEM(caPEM)
	pool.AddCert(tlsUp.Certificate()) // for the tunnelled request
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := func(model string) io.Reader {
		return strings.NewReader(`{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	}
	plainPort := strings.TrimPrefix(plain.URL, "http://127.0.0.1:")

	// Measured: plain HTTP to localhost. The client notes when the first
	// token reached it: no later than the sidecar read it, after the
	// sidecar's arrival instant (the TTFT's upper bound, below).
	sent := time.Now()
	resp, err := client.Post("http://localhost:"+plainPort+"/v1/chat/completions", "application/json", body("multi"))
	if err != nil {
		t.Fatal(err)
	}
	var clientTTFT time.Duration
	var got []byte
	for br := bufio.NewReader(resp.Body); ; {
		line, err := br.ReadBytes('\n')
		got = append(got, line...)
		if clientTTFT == 0 && bytes.Contains(line, []byte(`"reasoning_content"`)) {
			clientTTFT = time.Since(sent)
		}
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	if !strings.HasSuffix(string(got), "data: [DONE]\n\n") || strings.Contains(string(got), `"usage"`) {
		t.Fatalf("client got %q", got)
	}
	// Refused: HTTPS to localhost, whose certificate the system does not trust.
	resp, err = client.Post("https://localhost:"+tlsPort+"/v1/chat/completions", "application/json", body("one"))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("untrusted upstream: status %d, want 502", resp.StatusCode)
	}
	// Tunnelled: 127.0.0.1:tlsPort is on the tunnel allow-list.
	resp, err = client.Post("https://127.0.0.1:"+tlsPort+"/v1/chat/completions", "application/json", body("error"))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("tunnelled request: status %d", resp.StatusCode)
	}
	// Refused: the admin port, by address (not on the list) and behind
	// an intercepted name allowed to be internal (the sidecar's own).
	_, adminPort, _ := strings.Cut(a.Admin, ":")
	for _, u := range []string{"http://127.0.0.1:" + adminPort + "/metrics", "http://localhost:" + adminPort + "/metrics"} {
		resp, err = client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || strings.Contains(string(b), "tokentap_") {
			t.Errorf("GET %s through egress: %d %.100q, want 403", u, resp.StatusCode, b)
		}
	}

	type egressRec struct {
		Model     string   `json:"model"`
		Outcome   string   `json:"outcome"`
		Traffic   string   `json:"traffic"`
		Target    string   `json:"target"`
		ErrorType string   `json:"error_type"`
		TTFT      *float64 `json:"ttft_ms"`
		Tokens    *int     `json:"output_tokens"`
	}
	var recs []egressRec
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(recordsPath)
		recs = recs[:0]
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var r egressRec
			if json.Unmarshal([]byte(l), &r) == nil && r.Target != "" {
				recs = append(recs, r)
			}
		}
		if len(recs) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(100 * time.Millisecond) // a third, if one were coming
	if len(recs) != 2 {
		t.Fatalf("%d egress records, want 2: %+v", len(recs), recs)
	}
	byModel := map[string]egressRec{}
	for _, r := range recs {
		byModel[r.Model] = r
	}
	m := byModel["multi"]
	if m.Outcome != "success" || m.Traffic != "live" || m.Target != "localhost:"+plainPort || m.Tokens == nil || *m.Tokens != 6 || m.TTFT == nil {
		t.Errorf("measured record %+v", m)
	} else {
		// Between the instant the upstream wrote the first token (after
		// its own arrival, which follows the sidecar's) and the client's
		// own TTFT: both measured here, so a busy machine moves them with
		// the sidecar's (a fixed [100 ms, 130 ms] read 161 ms on one).
		up.mu.Lock()
		first := up.written["multi"][1] // role, then the reasoning token
		up.mu.Unlock()
		within(t, "egress ttft", *m.TTFT, first, clientTTFT)
	}
	if o := byModel["one"]; o.Outcome != "error" || o.ErrorType != "upstream_tls" || o.Target != "localhost:"+tlsPort {
		t.Errorf("untrusted upstream record %+v", o)
	}

	// Both on /metrics, under the target label.
	mresp, err := http.Get("http://" + a.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{
		`tokentap_target_requests_total{error_type="",gen_ai_operation_name="chat",gen_ai_request_model="multi",outcome="success",target="localhost",traffic="live"} 1`,
		`error_type="upstream_tls"`,
		`tokentap_egress_connects_total{action="intercept"} 1`,
		`tokentap_egress_connects_total{action="tunnel"} 1`,
		`tokentap_egress_refused_total{reason="not_allowed"} 1`,
		`tokentap_egress_refused_total{reason="self"} 1`,
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The egress listener and the reverse proxy's share one connection limit
// (one descriptor budget), counted once on the sidecar's /metrics: with
// --max-connections 1 and a client connection held open on the egress
// port, a request to the reverse proxy gets the 503.
func TestEgressSharesTheConnectionLimit(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"data":[]}`) }))
	defer up.Close()
	dir := t.TempDir()
	a, _ := startSidecar(t, up.URL, "--max-connections", "1", "--egress-listen", "127.0.0.1:0",
		"--egress-ca-cert", filepath.Join(dir, "ca.pem"), "--egress-ca-key", filepath.Join(dir, "ca-key.pem"))
	metrics := func() string {
		resp, err := http.Get("http://" + a.Admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	held, err := net.Dial("tcp", a.Egress)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for i := 0; !strings.Contains(metrics(), "tokentap_connections_open 1\n"); i++ {
		if i == 500 {
			t.Fatal("the egress connection was never counted in tokentap_connections_open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A raw connection, not http.Get: the 503 is written at accept, and
	// net/http's client reports an answer that came before its request
	// was under way as a broken connection (readLoopPeekFailLocked).
	c, err := net.Dial("tcp", a.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
		t.Errorf("the reverse proxy with the egress connection open: %q, want a 503 (one shared limit of 1)", b)
	}
	m := metrics()
	for _, want := range []string{"tokentap_connections_rejected_total 1\n", "tokentap_connections_max 1\n", "tokentap_connections_open 1\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
