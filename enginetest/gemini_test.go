package enginetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"
)

// The Gemini events the loopback upstream streams: those of
// stream/testdata/fixtures/gemini_stream.sse (a thought part, then two
// text parts, the last with finishReason STOP and the full usageMetadata).
var geminiEvents = []string{
	`{"candidates": [{"content": {"parts": [{"text": "**Greeting the user**\n\nA short, friendly reply.","thought": true}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 34,"thoughtsTokenCount": 25},"modelVersion": "gemini-2.5-flash","responseId": "mMgcaZ6BNOaFkdUPqZ-pkAs"}`,
	`{"candidates": [{"content": {"parts": [{"text": "Hello"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 34,"thoughtsTokenCount": 25},"modelVersion": "gemini-2.5-flash","responseId": "mMgcaZ6BNOaFkdUPqZ-pkAs"}`,
	`{"candidates": [{"content": {"parts": [{"text": " there!"}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 3,"totalTokenCount": 37,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 9}],"thoughtsTokenCount": 25},"modelVersion": "gemini-2.5-flash","responseId": "mMgcaZ6BNOaFkdUPqZ-pkAs"}`,
}

// The :generateContent answer: the same response in one body.
const geminiBody = `{"candidates": [{"content": {"parts": [{"text": "**Greeting the user**\n\nA short, friendly reply.","thought": true},{"text": "Hello there!"}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 3,"totalTokenCount": 37,"thoughtsTokenCount": 25},"modelVersion": "gemini-2.5-flash","responseId": "nNgcaZ6BNOaFkdUPqZ-pkAs"}`

const geminiModel = "gemini-2.5-flash"

var egressUpRe = regexp.MustCompile(`HTTPS_PROXY=http://(127\.0\.0\.1:\d+)`)

// Google's Gen AI Go SDK (google.golang.org/genai) through the sidecar's
// egress proxy, streamed (GenerateContentStream: :streamGenerateContent
// with alt=sse) and not (GenerateContent), against a loopback TLS
// upstream that answers as generativelanguage.googleapis.com does: the
// SDK gets the scripted text, and each request's record is a Gemini
// record with its stream flag, TTFT at the thought part, TTFOT at the
// first text part, the usageMetadata's token counts, the finish reason
// and the target host.
//
// The sidecar resolves names with the system's resolver and verifies
// the upstream against the system roots, so the upstream is named
// localhost (on --egress-intercept and --egress-internal-allow, the SDK's
// base URL pointed at it) and its self-signed certificate is the sidecar's
// SSL_CERT_FILE. The client goes through the proxy as HTTPS_PROXY makes
// it (CONNECT, then TLS to the sidecar's minted certificate, trusted
// from the generated egress CA), with the proxy set on its transport:
// net/http's ProxyFromEnvironment never proxies localhost. Needs no
// Ollama.
func TestGeminiSDKThroughEgress(t *testing.T) {
	// The upstream. A streamed answer writes the thought event, then waits
	// until the SDK has yielded it before the text events, so that the
	// first text reaches the sidecar strictly after the thought.
	thoughtSeen := make(chan struct{})
	type seen struct{ path, query, key string }
	got := make(chan seen, 2)
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case got <- seen{r.URL.Path, r.URL.RawQuery, r.Header.Get("x-goog-api-key")}:
		default: // more requests than the test sends: it fails on the records
		}
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1beta/models/"+geminiModel+":streamGenerateContent":
			w.Header().Set("Content-Type", "text/event-stream")
			for i, ev := range geminiEvents {
				if i == 1 {
					select {
					case <-thoughtSeen:
					case <-r.Context().Done():
						return
					case <-time.After(10 * time.Second):
						return // the test fails on the missing text
					}
				}
				io.WriteString(w, "data: "+ev+"\r\n\r\n")
				w.(http.Flusher).Flush()
			}
		case r.Method == "POST" && r.URL.Path == "/v1beta/models/"+geminiModel+":generateContent":
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			io.WriteString(w, geminiBody)
		default:
			http.NotFound(w, r)
		}
	}))
	dir := t.TempDir()
	cert, certPEM := localhostCert(t)
	upstream.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	upstream.StartTLS()
	defer upstream.Close()
	roots := filepath.Join(dir, "upstream-roots.pem")
	if err := os.WriteFile(roots, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", roots) // the sidecar's system roots (cleanEnv passes it on)

	// The reverse proxy's upstream, which this test does not use.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"data":[]}`) }))
	defer engine.Close()
	bin, err := buildSidecar(dir)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "egress-ca.pem")
	s := startSidecar(t, &world{sidecar: bin, ollama: engine.URL}, "--egress-listen", "127.0.0.1:0",
		"--egress-intercept", "localhost", "--egress-internal-allow", "localhost",
		"--egress-ca-cert", caFile, "--egress-ca-key", filepath.Join(dir, "egress-ca-key.pem"))
	var egressAddr string
	for deadline := time.Now().Add(10 * time.Second); egressAddr == ""; time.Sleep(10 * time.Millisecond) {
		if m := egressUpRe.FindStringSubmatch(s.log()); m != nil {
			egressAddr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the egress proxy did not come up in 10 s:\n%s", s.log())
		}
	}

	// The client: the SDK over an http.Client that goes through the
	// egress proxy and trusts its CA.
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("no certificate in %s", caFile)
	}
	proxyURL := &url.URL{Scheme: "http", Host: egressAddr}
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	_, port, _ := strings.Cut(strings.TrimPrefix(upstream.URL, "https://"), ":")
	target := "localhost:" + port
	ctx := t.Context()
	client, err := genai.NewClient(ctx, &genai.ClientConfig{APIKey: "test", Backend: genai.BackendGeminiAPI,
		HTTPClient: &http.Client{Transport: tr}, HTTPOptions: genai.HTTPOptions{BaseURL: "https://" + target + "/"}})
	if err != nil {
		t.Fatal(err)
	}
	contents := genai.Text("Say hello.")
	config := &genai.GenerateContentConfig{MaxOutputTokens: 64, ThinkingConfig: &genai.ThinkingConfig{IncludeThoughts: true}}

	// Streamed. The client notes when the thought and the first text
	// reached it: upper bounds of the sidecar's TTFT and TTFOT, which
	// start at the request's arrival, after the client's start.
	var thought, text strings.Builder
	var finish genai.FinishReason
	var usage *genai.GenerateContentResponseUsageMetadata
	var clientTTFT, clientTTFOT time.Duration
	sent := time.Now()
	for resp, err := range client.Models.GenerateContentStream(ctx, geminiModel, contents, config) {
		if err != nil {
			t.Fatalf("GenerateContentStream: %v", err)
		}
		for _, c := range resp.Candidates {
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
			if c.Content == nil {
				continue
			}
			for _, p := range c.Content.Parts {
				switch {
				case p.Thought && clientTTFT == 0:
					clientTTFT = time.Since(sent)
					thought.WriteString(p.Text)
					close(thoughtSeen)
				case p.Thought:
					thought.WriteString(p.Text)
				default:
					if clientTTFOT == 0 {
						clientTTFOT = time.Since(sent)
					}
					text.WriteString(p.Text)
				}
			}
		}
		usage = resp.UsageMetadata
	}
	if thought.String() != "**Greeting the user**\n\nA short, friendly reply." || text.String() != "Hello there!" || finish != genai.FinishReasonStop {
		t.Errorf("streamed: the SDK got thought %q, text %q, finish %q", thought.String(), text.String(), finish)
	}
	if usage == nil || usage.CandidatesTokenCount != 3 || usage.ThoughtsTokenCount != 25 || usage.PromptTokenCount != 9 {
		t.Errorf("streamed: the SDK got usage %+v", usage)
	}
	if g := <-got; g.path != "/v1beta/models/"+geminiModel+":streamGenerateContent" || g.query != "alt=sse" || g.key != "test" {
		t.Errorf("streamed: the upstream got %+v", g)
	}
	r := s.next(t)
	checkGeminiRecord(t, r, true, target)
	ttft, ttfot := r.raw["ttft_ms"], r.raw["ttfot_ms"]
	if r.TTFTms == nil || ttfot == nil {
		t.Errorf("streamed: ttft_ms %v, ttfot_ms %v", ttft, ttfot)
	} else {
		// The thought event is the first token; the first text, written
		// only after the SDK had yielded the thought, arrived later.
		if f := ttfot.(float64); !(0 < *r.TTFTms && *r.TTFTms < f) {
			t.Errorf("streamed: ttft_ms %v, ttfot_ms %v: want 0 < ttft < ttfot", *r.TTFTms, f)
		}
		t.Logf("streamed: ttft_ms %.3f (the client's %v), ttfot_ms %.3f (the client's %v)", *r.TTFTms, clientTTFT, ttfot, clientTTFOT)
		within(t, "ttft", *r.TTFTms, clientTTFT)
		within(t, "ttfot", ttfot.(float64), clientTTFOT)
	}
	if r.TokenEvents != 3 {
		t.Errorf("streamed: token_events %d, want 3 (the thought and two texts)", r.TokenEvents)
	}

	// Not streamed.
	resp, err := client.Models.GenerateContent(ctx, geminiModel, contents, config)
	if err != nil {
		t.Fatalf("GenerateContent: %v", err)
	}
	if resp.Text() != "Hello there!" || len(resp.Candidates) != 1 || resp.Candidates[0].FinishReason != genai.FinishReasonStop ||
		resp.UsageMetadata == nil || resp.UsageMetadata.CandidatesTokenCount != 3 {
		t.Errorf("not streamed: the SDK got %q, %+v", resp.Text(), resp)
	}
	if g := <-got; g.path != "/v1beta/models/"+geminiModel+":generateContent" || g.key != "test" {
		t.Errorf("not streamed: the upstream got %+v", g)
	}
	checkGeminiRecord(t, s.next(t), false, target)
}

// checkGeminiRecord checks what a Gemini record of the scripted answer
// says, streamed or not.
func checkGeminiRecord(t *testing.T, r rec, stream bool, target string) {
	t.Helper()
	if r.API != "gemini" || r.Stream != stream || r.Model != geminiModel || r.Outcome != "success" || r.HTTPStatus != 200 ||
		r.FinishReason != "STOP" || r.raw["target"] != target {
		t.Errorf("record (stream %v): %s", stream, r)
	}
	// Output: candidatesTokenCount plus thoughtsTokenCount.
	if r.InputTokens == nil || *r.InputTokens != 9 || r.OutputTokens == nil || *r.OutputTokens != 28 || r.TokenSource != "usage" {
		t.Errorf("record (stream %v) tokens: %s", stream, r)
	}
}

// within checks 0 < got ms ≤ bound.
func within(t *testing.T, what string, got float64, bound time.Duration) {
	t.Helper()
	if b := float64(bound) / float64(time.Millisecond); !(0 < got && got <= b) {
		t.Errorf("%s %.3f ms, want in (0, %.3f] (the client's own)", what, got, b)
	}
}

// localhostCert is a self-signed ECDSA certificate for localhost, and its
// PEM.
func localhostCert(t *testing.T) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
