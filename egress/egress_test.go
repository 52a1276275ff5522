package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

const chunk = `{"id":"chatcmpl-eg1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,`

func sse(data string) string { return "data: " + data + "\n\n" }

func delta(content string) string {
	return sse(chunk + `"delta":{"content":"` + content + `"},"finish_reason":null}]}`)
}

// chatScript is a hosted chat completion: a role chunk, four content
// events at irregular instants (one long gap), the finish chunk, the
// usage chunk (only when asked for: the sidecar cuts it) and [DONE].
var chatScript = []step{
	{40 * time.Millisecond, sse(chunk + `"delta":{"role":"assistant","content":""},"finish_reason":null}]}`), ""},
	{100 * time.Millisecond, delta("Hel"), ""},
	{130 * time.Millisecond, delta("lo"), ""},
	{145 * time.Millisecond, delta(" wor"), ""},
	{400 * time.Millisecond, delta("ld"), ""},
	{410 * time.Millisecond, sse(chunk + `"delta":{},"finish_reason":"stop"}]}`), ""},
	{415 * time.Millisecond, sse(`{"id":"chatcmpl-eg1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}`), "cut"},
	{420 * time.Millisecond, sse("[DONE]"), ""},
}

// script returns chatScript with each step's client bytes set: the raw
// bytes, except the usage chunk, which the client never sees.
func script() []step {
	out := append([]step(nil), chatScript...)
	for i := range out {
		if out[i].client == "cut" {
			out[i].client = ""
		} else {
			out[i].client = out[i].raw
		}
	}
	return out
}

const chatBody = `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"say hello world"}]}`

// The acceptance test: a client configured only with the proxy and the
// CA file streams a scripted chat completion from a TLS upstream; the
// record's TTFT, TPOT, gaps, tokens and outcome are the script's, exactly
// (a fake clock the upstream sets before each write); the client's bytes
// are the upstream's (less the usage chunk the sidecar asked for); the
// credentials reach the upstream untouched and appear nowhere in the
// record; the target labels the record, the metrics and the span. Over
// HTTP/1.1 and HTTP/2 to the client.
func TestScriptedChatThroughEgress(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := map[bool]string{false: "http1.1", true: "http2"}[h2]
		t.Run(name, func(t *testing.T) {
			u := newLockstep(t, script())
			h := newHarness(t, harnessOpts{clock: u.clock})
			_, port := hosted(t, h.hosted, u, "api.openai.test")
			target := "api.openai.test:" + port

			req, _ := http.NewRequest("POST", "https://"+target+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer sk-test-secret-0123456789")
			resp, err := h.client(t, h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if want := map[bool]int{false: 1, true: 2}[h2]; resp.ProtoMajor != want {
				t.Fatalf("client spoke %s, want HTTP/%d", resp.Proto, want)
			}
			// The client saw the sidecar's certificate for the host,
			// from the sidecar's CA.
			if cs := resp.TLS; cs == nil || cs.PeerCertificates[0].Issuer.CommonName != h.p.CA().Cert.Subject.CommonName {
				t.Fatalf("client's peer certificate is not the sidecar's: %+v", cs)
			}
			got := readLockstep(t, u, resp.Body)
			var want strings.Builder
			for _, s := range chatScript {
				if s.client != "cut" {
					want.WriteString(s.raw)
				}
			}
			if got != want.String() {
				t.Fatalf("client bytes differ from the upstream's:\n got %q\nwant %q", got, want.String())
			}
			up := <-u.req
			if up.header.Get("Authorization") != "Bearer sk-test-secret-0123456789" {
				t.Errorf("credentials were not passed through untouched: %q", up.header.Get("Authorization"))
			}
			if up.host != target {
				t.Errorf("upstream Host %q, want %q", up.host, target)
			}
			if !bytes.Contains(up.body, []byte(`"include_usage":true`)) {
				t.Errorf("usage was not asked for: %s", up.body)
			}

			rec := h.sink.wait(t, 1)[0]
			ms := func(d time.Duration) time.Duration { return d }
			if rec.Outcome != record.Success || rec.ErrorType != "" || rec.HTTPStatus != 200 || rec.FinishReason != "stop" {
				t.Errorf("outcome %s/%q status %d finish %q", rec.Outcome, rec.ErrorType, rec.HTTPStatus, rec.FinishReason)
			}
			if ttft, ok := rec.TTFT(); !ok || ttft != ms(100*time.Millisecond) {
				t.Errorf("TTFT %v, want 100ms", ttft)
			}
			if tpot, ok := rec.TPOT(); !ok || tpot != ms(100*time.Millisecond) { // (400-100)/(4-1)
				t.Errorf("TPOT %v, want 100ms", tpot)
			}
			var gaps []time.Duration
			rec.Gaps(func(g time.Duration) { gaps = append(gaps, g) })
			if wantGaps := []time.Duration{30 * time.Millisecond, 15 * time.Millisecond, 255 * time.Millisecond}; !equalDurations(gaps, wantGaps) {
				t.Errorf("gaps %v, want %v", gaps, wantGaps)
			}
			if rec.MaxGap != 255*time.Millisecond {
				t.Errorf("max ITL %v, want 255ms", rec.MaxGap)
			}
			if e2e, ok := rec.E2E(); !ok || e2e != 420*time.Millisecond {
				t.Errorf("E2E %v, want 420ms", e2e)
			}
			if ttfb, ok := rec.TTFB(); !ok || ttfb != 40*time.Millisecond {
				t.Errorf("TTFB %v, want 40ms", ttfb)
			}
			if rec.OutputTokens != 4 || rec.InputTokens != 9 || rec.TokenSource != "usage" || rec.TokenEvents() != 4 || !rec.UsageInjected {
				t.Errorf("tokens out %d in %d source %s events %d injected %v", rec.OutputTokens, rec.InputTokens, rec.TokenSource, rec.TokenEvents(), rec.UsageInjected)
			}
			if rec.Traffic != "live" || rec.API != stream.NameChat || rec.Model != "gpt-test" {
				t.Errorf("traffic %q api %q model %q", rec.Traffic, rec.API, rec.Model)
			}
			if rec.Target != target || rec.TargetRule != "api.openai.test" {
				t.Errorf("target %q rule %q", rec.Target, rec.TargetRule)
			}
			line, _ := rec.MarshalJSON()
			if bytes.Contains(line, []byte("sk-test")) || bytes.Contains(line, []byte("hello world")) {
				t.Errorf("the record holds a credential or content: %s", line)
			}
			if !bytes.Contains(line, []byte(`"target":"`+target+`","target_rule":"api.openai.test"`)) {
				t.Errorf("the record's JSON lacks the target: %s", line)
			}

			// Metrics: the usual series, and the target's.
			lbl := map[string]string{"target": "api.openai.test", "outcome": "success", "gen_ai_request_model": "gpt-test", "traffic": "live"}
			if n := counter(t, h.metrics.Registry, "tokentap_target_requests_total", lbl); n != 1 {
				t.Errorf("tokentap_target_requests_total{target=api.openai.test} = %v, want 1", n)
			}
			if n, sum := histCount(t, h.metrics.Registry, "tokentap_target_time_to_first_token_seconds", map[string]string{"target": "api.openai.test"}); n != 1 || sum != 0.1 {
				t.Errorf("target TTFT histogram: %d samples, sum %v; want 1, 0.1", n, sum)
			}
			if n, sum := histCount(t, h.metrics.Registry, "tokentap_target_time_per_output_token_seconds", map[string]string{"target": "api.openai.test"}); n != 1 || sum != 0.1 {
				t.Errorf("target TPOT histogram: %d samples, sum %v; want 1, 0.1", n, sum)
			}
			if n := counter(t, h.metrics.Registry, "tokentap_requests_total", map[string]string{"outcome": "success", "traffic": "live"}); n != 1 {
				t.Errorf("tokentap_requests_total = %v, want 1", n)
			}
			if n := counter(t, h.reg, "tokentap_egress_connects_total", map[string]string{"action": "intercept"}); n != 1 {
				t.Errorf("intercepted CONNECTs = %v, want 1", n)
			}

			// Spans: the inference span names the hosted API.
			var found bool
			for _, s := range h.spans.Ended() {
				for _, a := range s.Attributes() {
					if a.Key == attribute.Key("server.address") && a.Value.AsString() == "api.openai.test" {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("no span has server.address=api.openai.test (%d spans)", len(h.spans.Ended()))
			}
		})
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// With usage injection off, the request and the response are forwarded
// byte for byte: the usage chunk the client asked for itself reaches it.
func TestInjectionOffIsByteForByte(t *testing.T) {
	steps := append([]step(nil), chatScript...)
	for i := range steps {
		steps[i].client = steps[i].raw
	}
	u := newLockstep(t, steps)
	h := newHarness(t, harnessOpts{clock: u.clock, noInject: true})
	_, port := hosted(t, h.hosted, u, "api.openai.test")
	body := `{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	resp, err := h.client(t, false).Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := readLockstep(t, u, resp.Body)
	var want strings.Builder
	for _, s := range steps {
		want.WriteString(s.raw)
	}
	if got != want.String() {
		t.Fatalf("client bytes differ:\n got %q\nwant %q", got, want.String())
	}
	if up := <-u.req; string(up.body) != body {
		t.Errorf("request body changed: %s", up.body)
	}
	rec := h.sink.wait(t, 1)[0]
	if rec.UsageInjected || rec.OutputTokens != 4 || rec.Outcome != record.Success {
		t.Errorf("injected %v tokens %d outcome %s", rec.UsageInjected, rec.OutputTokens, rec.Outcome)
	}
}

// A CONNECT to a host:port on the tunnel allow-list is a blind tunnel:
// the client completes its TLS handshake with the real server's
// certificate (from a CA the client alone trusts; the sidecar's CA never
// minted one), the request's plaintext never crosses the sidecar in the
// clear, and no record, metric or span appears.
func TestTunnelIsBlind(t *testing.T) {
	hostedCA := newTestCA(t, "hosted API CA")
	const secret = "tunnelled-plaintext-marker-7f3a"
	srv, port := hosted(t, hostedCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !bytes.Contains(b, []byte(secret)) {
			t.Errorf("the tunnelled server got %q", b)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, delta(secret+"-answer"))
		io.WriteString(w, sse("[DONE]"))
	}), "other.test")
	h := newHarness(t, harnessOpts{hosted: hostedCA, tunnel: []string{"other.test:" + port}})
	// The client trusts only the hosted API's CA: an intercepted
	// connection (a certificate from the sidecar's CA) would fail.
	tr := &http.Transport{Proxy: http.ProxyURL(h.proxy), TLSClientConfig: &tls.Config{RootCAs: h.hosted.pool}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post("https://other.test:"+port+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"`+secret+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(secret+"-answer")) {
		t.Fatalf("tunnelled answer %q", b)
	}
	if got, want := resp.TLS.PeerCertificates[0].Raw, srv.TLS.Certificates[0].Certificate[0]; !bytes.Equal(got, want) {
		t.Fatal("the client's peer certificate is not the server's own")
	}
	if err := resp.TLS.PeerCertificates[0].CheckSignatureFrom(h.p.CA().Cert); err == nil {
		t.Fatal("the tunnelled host's certificate was signed by the sidecar's CA")
	}
	if h.p.leaves.len() != 0 {
		t.Errorf("the sidecar minted %d certificates for a tunnelled host", h.p.leaves.len())
	}
	// What crossed the sidecar's upstream connection is ciphertext.
	if h.dial.wireLen() == 0 {
		t.Fatal("nothing crossed the tunnel's upstream connection")
	}
	if h.dial.sawWire([]byte(secret)) || h.dial.sawWire([]byte("chat/completions")) {
		t.Fatal("the sidecar saw the tunnelled plaintext")
	}
	time.Sleep(50 * time.Millisecond) // a record, if one were coming
	if n := len(h.sink.all()); n != 0 {
		t.Fatalf("%d records for a tunnelled request", n)
	}
	if n := counter(t, h.metrics.Registry, "tokentap_requests_total", nil); n != 0 {
		t.Errorf("tokentap_requests_total = %v for a tunnel", n)
	}
	if n := len(h.spans.Ended()); n != 0 {
		t.Errorf("%d spans for a tunnel", n)
	}
	if n := counter(t, h.reg, "tokentap_egress_connects_total", map[string]string{"action": "tunnel"}); n != 1 {
		t.Errorf("tunnelled CONNECTs = %v, want 1", n)
	}
}

// With tunnelling off, a host not on the list is refused with a 403.
func TestTunnelOffRefuses(t *testing.T) {
	h := newHarness(t, harnessOpts{noTunnel: true})
	_, port := hosted(t, h.hosted, http.NotFoundHandler(), "other.test")
	_, err := h.client(t, false).Get("https://other.test:" + port + "/")
	if err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("err %v, want the CONNECT refused (403)", err)
	}
	resp, err := h.client(t, false).Get("http://other.test:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("plain forward status %d, want 403", resp.StatusCode)
	}
	if n := counter(t, h.reg, "tokentap_egress_connects_total", map[string]string{"action": "refuse"}); n != 1 {
		t.Errorf("refused CONNECTs = %v", n)
	}
}

// An intercepted host whose certificate does not verify: the client gets
// an error (502 with the reason), the record says error/upstream_tls.
func TestUntrustedUpstreamCertificate(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	rogue := newTestCA(t, "rogue CA") // not in the sidecar's roots
	reached := make(chan struct{}, 1)
	_, port := hosted(t, rogue, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- struct{}{} }), "api.badcert.test")
	resp, err := h.client(t, false).Post("https://api.badcert.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "certificate") {
		t.Errorf("client got %d %q, want 502 naming the certificate", resp.StatusCode, b)
	}
	select {
	case <-reached:
		t.Error("the request reached a host whose certificate did not verify")
	default:
	}
	rec := h.sink.wait(t, 1)[0]
	if rec.Outcome != record.Error || rec.ErrorType != record.ErrUpstreamTLS || rec.HTTPStatus != 502 {
		t.Errorf("record %s/%s status %d, want error/upstream_tls 502", rec.Outcome, rec.ErrorType, rec.HTTPStatus)
	}
	line, _ := rec.MarshalJSON()
	if !bytes.Contains(line, []byte(`"error_type":"upstream_tls"`)) {
		t.Errorf("record JSON: %s", line)
	}
	if n := counter(t, h.metrics.Registry, "tokentap_target_requests_total", map[string]string{"target": "api.badcert.test", "error_type": "upstream_tls"}); n != 1 {
		t.Errorf("target error series = %v", n)
	}
}

// Plain-HTTP forward requests: to a host on the list, measured like an
// intercepted one; to one on the tunnel allow-list, forwarded untouched
// and not recorded.
func TestPlainHTTPForward(t *testing.T) {
	upstream := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, s := range chatScript {
			if s.client == "cut" && !strings.Contains(r.Header.Get("X-Test-Usage"), "yes") {
				continue
			}
			io.WriteString(w, s.raw)
			w.(http.Flusher).Flush()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(upstream)}
	go srv.Serve(ln)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	h := newHarness(t, harnessOpts{tunnel: []string{"other.test:" + port}})

	c := h.client(t, false)
	for _, host := range []string{"plain.test", "other.test"} {
		resp, err := c.Post("http://"+host+":"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Contains(string(b), `"usage"`) {
			t.Errorf("%s: client got %q", host, b)
		}
	}
	h.sink.wait(t, 1)
	time.Sleep(50 * time.Millisecond) // a second, if one were coming
	recs := h.sink.all()
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1 (plain.test only)", len(recs))
	}
	r := recs[0]
	if r.Target != "plain.test:"+port || r.Outcome != record.Success || r.TokenEvents() != 4 || r.TargetRule != "plain.test" {
		t.Errorf("record target %q rule %q outcome %s token events %d", r.Target, r.TargetRule, r.Outcome, r.TokenEvents())
	}
}

// A client that goes away mid-stream: the upstream's request is
// cancelled, and the record says cancelled.
func TestCancellationPropagates(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1.1", true: "http2"}[h2], func(t *testing.T) {
			upCtx := make(chan error, 1)
			h := newHarness(t, harnessOpts{})
			_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for i := 0; ; i++ {
					io.WriteString(w, delta("w"))
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						upCtx <- r.Context().Err()
						panic(http.ErrAbortHandler) // as TestTimeoutApplies
					case <-time.After(20 * time.Millisecond):
					}
					if i > 500 {
						t.Error("the upstream was never cancelled")
						return
					}
				}
			}), "api.openai.test")
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", "https://api.openai.test:"+port+"/v1/chat/completions", strings.NewReader(chatBody))
			resp, err := h.client(t, h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, len(delta("w"))*2)
			if _, err := io.ReadFull(resp.Body, buf); err != nil {
				t.Fatal(err)
			}
			cancel()
			resp.Body.Close()
			select {
			case err := <-upCtx:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("upstream context ended with %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream request was not cancelled")
			}
			rec := h.sink.wait(t, 1)[0]
			if rec.Outcome != record.Cancelled {
				t.Errorf("outcome %s/%s, want cancelled", rec.Outcome, rec.ErrorType)
			}
		})
	}
}

// The reverse proxy's limits hold: a whole-request timeout cuts a stream
// and records timeout.
func TestTimeoutApplies(t *testing.T) {
	h := newHarness(t, harnessOpts{timeout: 150 * time.Millisecond})
	_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, delta("a"))
		w.(http.Flusher).Flush()
		select { // never finishes on its own
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		// Cut the connection rather than end the body cleanly: a TLS
		// client's close_notify can reach this handler before its socket
		// closes, and a clean end read then would be an incomplete stream.
		panic(http.ErrAbortHandler)
	}), "api.openai.test")
	resp, err := h.client(t, false).Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	rec := h.sink.wait(t, 1)[0]
	if rec.Outcome != record.Timeout {
		line, _ := rec.MarshalJSON()
		t.Errorf("outcome %s/%s, want timeout: %s", rec.Outcome, rec.ErrorType, line)
	}
}

// A wildcard entry matches hosts under its domain; the label is the
// entry, so it stays bounded whatever the host.
func TestWildcardTargetLabel(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	_, port := hosted(t, h.hosted, handler, "res-one.azure.test", "res-two.eu.azure.test")
	c := h.client(t, true)
	for _, host := range []string{"res-one.azure.test", "res-two.eu.azure.test"} {
		resp, err := c.Post("https://"+host+":"+port+"/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21", "application/json",
			strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	recs := h.sink.wait(t, 2)
	for _, r := range recs {
		if r.TargetRule != "*.azure.test" || !strings.HasSuffix(r.Target, ".azure.test:"+port) || r.OutputTokens != 1 {
			t.Errorf("target %q rule %q tokens %d", r.Target, r.TargetRule, r.OutputTokens)
		}
	}
	if n := counter(t, h.metrics.Registry, "tokentap_target_requests_total", map[string]string{"target": "*.azure.test"}); n != 2 {
		t.Errorf("target series = %v, want 2 under one label", n)
	}
}

// The per-host upstream proxies are bounded: idle ones past max_targets
// are dropped.
func TestTargetsBounded(t *testing.T) {
	built := 0
	ts := &targets{max: 2, m: map[string]*targetEntry{}}
	h := newHarness(t, harnessOpts{})
	ts.build = func(tg target) (*proxy.Proxy, error) { built++; return h.p.newTargetProxy(tg) }
	for i, host := range []string{"a.azure.test", "b.azure.test", "c.azure.test", "a.azure.test"} {
		tg := target{scheme: "https", authority: host, rule: "*.azure.test"}
		e, err := ts.acquire(tg)
		if err != nil {
			t.Fatal(err)
		}
		ts.release(tg, e)
		if ts.len() > 2 {
			t.Fatalf("step %d: %d proxies held, max 2", i, ts.len())
		}
	}
	if built != 4 { // a was dropped for c, then built again
		t.Errorf("built %d proxies, want 4", built)
	}
	// Busy ones are never dropped: three at once are all held, and
	// trimmed back to the bound as they finish.
	var held []*targetEntry
	var tgs []target
	for _, host := range []string{"x.azure.test", "y.azure.test", "z.azure.test"} {
		tg := target{scheme: "https", authority: host, rule: "*.azure.test"}
		e, _ := ts.acquire(tg)
		held, tgs = append(held, e), append(tgs, tg)
	}
	if ts.len() != 3 {
		t.Errorf("%d held while three are busy", ts.len())
	}
	for i := range held {
		ts.release(tgs[i], held[i])
	}
	if ts.len() != 2 {
		t.Errorf("%d held after release, want 2", ts.len())
	}
}

// A request that is not a proxy request gets a 400 that says how to use
// the proxy.
func TestNonProxyRequest(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	resp, err := http.Get("http://" + h.addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "HTTPS_PROXY") {
		t.Errorf("%d %q", resp.StatusCode, b)
	}
}

// The record's JSON is valid with the target fields.
func TestRecordJSONTarget(t *testing.T) {
	r := record.New(0)
	r.Target, r.TargetRule = "x.azure.test", "*.azure.test"
	b, _ := r.MarshalJSON()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["target"] != "x.azure.test" || m["target_rule"] != "*.azure.test" {
		t.Errorf("%v %s", err, b)
	}
}

// Test hosts never resolve outside loopback, and the test dialer dials
// nothing else.
func TestDialerRefusesRealHosts(t *testing.T) {
	var d dialer
	if _, err := d.LookupIP(context.Background(), "api.openai.com"); err == nil {
		t.Fatal("the test resolver resolved a real host")
	}
	for _, addr := range []string{"api.openai.com:443", "192.0.2.1:443"} {
		if _, err := d.DialContext(context.Background(), "tcp", addr); err == nil {
			t.Fatalf("the test dialer dialled %s", addr)
		}
	}
}

// Shutdown waits for measured streams; when the grace is over, Cut ends
// them, recorded as error/shutdown.
func TestShutdownCutsStreams(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	started := make(chan struct{})
	_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, delta("a"))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		panic(http.ErrAbortHandler)
	}), "api.openai.test")
	go func() {
		resp, err := h.client(t, true).Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil {
			io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.p.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown returned while a stream was running")
	}
	if n := h.p.Cut(); n != 1 {
		t.Errorf("Cut cut %d streams, want 1", n)
	}
	rec := h.sink.wait(t, 1)[0]
	if rec.Outcome != record.Error || rec.ErrorType != record.ErrShutdown {
		t.Errorf("outcome %s/%s, want error/shutdown", rec.Outcome, rec.ErrorType)
	}
}

// Concurrent streams through one intercepted host, over both protocols:
// every client gets the upstream's bytes, every request one record.
func TestConcurrentStreams(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	const n = 16
	var want strings.Builder
	for i := range 20 {
		want.WriteString(delta(strings.Repeat("x", i)))
	}
	want.WriteString(sse("[DONE]"))
	_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 20 {
			io.WriteString(w, delta(strings.Repeat("x", i)))
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
		io.WriteString(w, sse("[DONE]"))
	}), "api.openai.test")
	errs := make(chan error, n)
	for i := range n {
		c := h.client(t, i%2 == 0)
		go func() {
			resp, err := c.Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != want.String() {
				errs <- errors.New("bytes differ: " + string(b))
				return
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	recs := h.sink.wait(t, n)
	for _, r := range recs {
		if r.Outcome != record.Success || r.TokenEvents() != 19 { // the first delta is empty
			t.Errorf("record %s, %d token events", r.Outcome, r.TokenEvents())
		}
	}
	if got := h.p.leaves.len(); got != 1 {
		t.Errorf("%d certificates minted for one host", got)
	}
}
