package egress

import (
	"bufio"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
)

// rawRequest sends req (a whole HTTP/1.1 request head) to the proxy on
// a new connection and returns its answer with the body read.
func rawRequest(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to %.80q: %v", req, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func connect(authority string, header ...string) string {
	return "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n" + strings.Join(header, "") + "\r\n"
}

// listen returns a loopback listener that answers every request with
// body (an HTTP server), and how many requests reached it.
func listen(t *testing.T, body string) (net.Listener, string, func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return srv.Listener, port, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// Through egress, the destinations an open relay would reach are refused
// with a 403 before anything is dialled, each counted by its reason: the
// admin port (a loopback listener stands in for it) by address and by a
// name that resolves to it, however allowed by name; a loopback port not
// on the allow-list; a loopback port allowed by name but not internal;
// the link-local metadata address (169.254.169.254) written as an
// address, IPv4-mapped, or behind a name, the refusal coming from the
// guard with the dialer never called (no packet leaves the machine); the
// proxy's own address; an intercepted host that resolves to loopback
// without internal_allow. Allowed destinations still pass (the rest of
// the suite).
func TestRefusedDestinations(t *testing.T) {
	admin, adminPort, adminHits := listen(t, "tokentap_requests_total 1\n")
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, selfPort, _ := net.SplitHostPort(proxyLn.Addr().String())
	_, loopPort, loopHits := listen(t, "an internal service\n")
	h := newHarness(t, harnessOpts{ln: proxyLn, own: []net.Addr{admin.Addr()},
		intercept: []string{"api.openai.test"},
		tunnel: []string{"admin.test:" + adminPort, "127.0.0.1:" + adminPort, "loop.test:" + loopPort, "169.254.169.254", "::ffff:169.254.169.254",
			"metadata.test", "self.test:" + selfPort, "0.0.0.0:" + selfPort},
		internal: []string{"admin.test", "127.0.0.1", "self.test", "0.0.0.0"},
		resolve:  map[string][]netip.Addr{"metadata.test": {netip.MustParseAddr("169.254.169.254")}},
	})
	cases := []struct {
		authority, reason string
	}{
		{"127.0.0.1:" + adminPort, reasonSelf},       // allowed by name and internal_allow: still the sidecar's own
		{"admin.test:" + adminPort, reasonSelf},      // the same, behind a name
		{"localhost:" + adminPort, reasonNotAllowed}, // not on the list
		{"127.0.0.1:" + loopPort, reasonNotAllowed},  // a loopback port not allowed
		{"loop.test:" + loopPort, reasonInternal},    // allowed, but resolves to loopback and is not on internal_allow
		{"169.254.169.254:443", reasonInternal},      // cloud metadata
		{"[::ffff:169.254.169.254]:443", reasonInternal},
		{"metadata.test:443", reasonInternal},
		{"[fe80::1]:443", reasonNotAllowed},
		{"127.0.0.1:" + selfPort, reasonNotAllowed},
		{"self.test:" + selfPort, reasonSelf},
		{"0.0.0.0:" + selfPort, reasonSelf},
		{"api.openai.test:443", reasonInternal}, // intercepted, but on loopback and not on internal_allow
	}
	want := map[string]float64{}
	for i, c := range cases {
		resp, body := rawRequest(t, h.addr, connect(c.authority))
		want[c.reason]++
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d %q, want 403", c.authority, resp.StatusCode, body)
		}
		if strings.Contains(body, "169.254") && !strings.Contains(c.authority, "169.254") || strings.Contains(body, "127.0.0.1") && !strings.Contains(c.authority, "127.0.0.1") {
			t.Errorf("CONNECT %s: the answer names a resolved address: %q", c.authority, body)
		}
		for r, n := range want {
			if got := counter(t, h.reg, "tokentap_egress_refused_total", map[string]string{"reason": r}); got != n {
				t.Errorf("after case %d (%s): tokentap_egress_refused_total{reason=%q} = %v, want %v", i, c.authority, r, got, n)
			}
		}
	}
	if n := counter(t, h.reg, "tokentap_egress_connects_total", map[string]string{"action": "refuse"}); n != float64(len(cases)) {
		t.Errorf("tokentap_egress_connects_total{action=refuse} = %v, want %d", n, len(cases))
	}
	if n := counter(t, h.reg, "tokentap_egress_connects_total", map[string]string{"action": "tunnel"}); n != 0 {
		t.Errorf("%v CONNECTs tunnelled", n)
	}
	if d := h.dial.dials(); len(d) != 0 {
		t.Errorf("the dialer was called for refused destinations: %v", d)
	}
	if adminHits() != 0 || loopHits() != 0 {
		t.Errorf("a refused destination was reached: admin %d, loopback %d", adminHits(), loopHits())
	}
}

// The issue's own command: curl -x http://127.0.0.1:PORT
// http://127.0.0.1:9464/metrics returned the admin port's metrics; now a
// plain-HTTP forward request to any destination not allowed is refused
// (403, counted), and the admin port is never reached. With curl when it
// is installed, and with Go's client.
func TestPlainForwardToAdminRefused(t *testing.T) {
	admin, adminPort, adminHits := listen(t, "tokentap_requests_total 1\n")
	h := newHarness(t, harnessOpts{own: []net.Addr{admin.Addr()}})
	target := "http://127.0.0.1:" + adminPort + "/metrics"
	if curl, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--noproxy", "", "-x", "http://"+h.addr, target).Output()
		if err != nil || string(out) != "403" {
			t.Errorf("curl -x http://%s %s: %q %v, want 403", h.addr, target, out, err)
		}
	}
	proxyURL, _ := url.Parse("http://" + h.addr)
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL)}
	defer tr.CloseIdleConnections()
	for _, u := range []string{target, "http://localhost:" + adminPort + "/metrics", "http://169.254.169.254/latest/meta-data/"} {
		resp, err := (&http.Client{Transport: tr}).Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || strings.Contains(string(b), "tokentap_requests_total") {
			t.Errorf("GET %s through egress: %d %q, want 403", u, resp.StatusCode, b)
		}
	}
	if adminHits() != 0 {
		t.Errorf("the admin port was reached %d times", adminHits())
	}
	if n := counter(t, h.reg, "tokentap_egress_refused_total", map[string]string{"reason": reasonNotAllowed}); n < 3 {
		t.Errorf("refused not_allowed = %v, want at least 3", n)
	}
	if d := h.dial.dials(); len(d) != 0 {
		t.Errorf("dialled %v", d)
	}
}

// A CONNECT to the egress proxy itself through itself is refused at the
// first level: the listener accepts one connection (the client's), not
// two per level, even when the operator allowed the address by name.
func TestSelfConnectLoopRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := ln.Addr().String()
	_, port, _ := net.SplitHostPort(self)
	h := newHarness(t, harnessOpts{ln: ln, tunnel: []string{"127.0.0.1:" + port, "self.test:" + port}, internal: []string{"127.0.0.1", "self.test"}})
	for _, a := range []string{self, "self.test:" + port} {
		resp, body := rawRequest(t, h.addr, connect(a))
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d %q", a, resp.StatusCode, body)
		}
	}
	// A plain forward request to itself too.
	resp, _ := rawRequest(t, h.addr, "GET http://"+self+"/ HTTP/1.1\r\nHost: "+self+"\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET http://%s/ through itself: %d", self, resp.StatusCode)
	}
	if n := h.accepted.n.Load(); n != 3 {
		t.Errorf("the proxy accepted %d connections for 3 requests: it connected to itself", n)
	}
	if n := counter(t, h.reg, "tokentap_egress_refused_total", map[string]string{"reason": reasonSelf}); n != 3 {
		t.Errorf("refused self = %v, want 3", n)
	}
}

// DNS rebinding gains nothing: the addresses checked are the addresses
// dialled. An intercepted name that resolved to an outside address when
// the CONNECT was checked and to loopback when the upstream connection
// is made is refused at the dial (502), the dialer never asked for the
// loopback address; a tunnel dials the very address it checked, after
// one lookup.
func TestDNSRebindingRefused(t *testing.T) {
	outside, lo := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("127.0.0.1")
	h := newHarness(t, harnessOpts{intercept: []string{"flip.test"}, internal: []string{}, tunnel: []string{"flop.test"},
		resolve: map[string][]netip.Addr{"flip.test": {outside, lo}, "flop.test": {outside, lo}}})
	_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the rebound name was reached") }), "flip.test")
	resp, err := h.client(t, false).Get("https://flip.test:" + port + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("rebound intercepted host: %d, want 502", resp.StatusCode)
	}
	for _, d := range h.dial.dials() {
		t.Errorf("dialled %s", d)
	}
	if n := counter(t, h.reg, "tokentap_egress_refused_total", map[string]string{"reason": reasonInternal}); n != 1 {
		t.Errorf("refused internal = %v, want 1 (at the dial)", n)
	}

	resp, _ = rawRequest(t, h.addr, connect("flop.test:443"))
	if resp.StatusCode != http.StatusBadGateway { // the test dialer dials loopback only
		t.Errorf("tunnel to flop.test: %d, want 502 from the test dialer", resp.StatusCode)
	}
	if d := h.dial.dials(); len(d) != 1 || d[0] != "192.0.2.10:443" {
		t.Errorf("the tunnel dialled %v, want the checked address 192.0.2.10:443 only", d)
	}
	n := 0
	h.dial.mu.Lock()
	for _, l := range h.dial.lookups {
		if l == "flop.test" {
			n++
		}
	}
	h.dial.mu.Unlock()
	if n != 1 {
		t.Errorf("flop.test looked up %d times, want once", n)
	}
}

// Proxy authentication: without credentials or with wrong ones, 407 with
// Proxy-Authenticate (CONNECT and plain forward alike, counted); with a
// user:password line or a token from the file, the request is served and
// measured; the credentials are not forwarded and appear in no log line.
func TestProxyAuth(t *testing.T) {
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth")
	os.WriteFile(authFile, []byte("# egress clients\nalice:s3cret-pass:word\n\ntok-9f8e7d\n"), 0o600)
	u := newLockstep(t, script())
	h := newHarness(t, harnessOpts{clock: u.clock, authFile: authFile, debugLogs: true})
	_, port := hosted(t, h.hosted, u, "api.openai.test")

	basic := func(user, pass string) string {
		return "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + "\r\n"
	}
	authority := "api.openai.test:" + port
	for _, hdr := range []string{"", basic("alice", "wrong"), basic("bob", "s3cret-pass:word"), basic("alice", "tok-9f8e7d-"), "Proxy-Authorization: Bearer tok-9f8e7d\r\n"} {
		resp, _ := rawRequest(t, h.addr, connect(authority, hdr))
		if resp.StatusCode != http.StatusProxyAuthRequired || !strings.HasPrefix(resp.Header.Get("Proxy-Authenticate"), "Basic ") {
			t.Errorf("CONNECT with %q: %d %q, want 407 with a Basic challenge", hdr, resp.StatusCode, resp.Header.Get("Proxy-Authenticate"))
		}
	}
	resp, _ := rawRequest(t, h.addr, "GET http://plain.test:1/ HTTP/1.1\r\nHost: plain.test:1\r\n\r\n")
	if resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("plain forward without credentials: %d, want 407", resp.StatusCode)
	}
	if n := counter(t, h.reg, "tokentap_egress_refused_total", map[string]string{"reason": reasonAuth}); n != 6 {
		t.Errorf("refused auth = %v, want 6", n)
	}
	if n := counter(t, h.reg, "tokentap_egress_connects_total", map[string]string{"action": "refuse"}); n != 5 {
		t.Errorf("refused CONNECTs = %v, want 5", n)
	}
	if d := h.dial.dials(); len(d) != 0 {
		t.Errorf("dialled without credentials: %v", d)
	}

	// Right credentials, in the proxy URL as HTTPS_PROXY carries them.
	proxyURL, _ := url.Parse("http://alice:s3cret-pass%3Aword@" + h.addr)
	req, _ := http.NewRequest("POST", "https://"+authority+"/v1/chat/completions", strings.NewReader(chatBody))
	resp, err := clientWith(t, proxyURL, h.caFile, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("with credentials: %d", resp.StatusCode)
	}
	readLockstep(t, u, resp.Body)
	resp.Body.Close()
	if rec := h.sink.wait(t, 1)[0]; rec.OutputTokens != 4 {
		t.Errorf("record tokens %d", rec.OutputTokens)
	}
	// A token, on a plain forward request: served, and the header not forwarded.
	got := make(chan http.Header, 1)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer plain.Close()
	_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())
	resp, body := rawRequest(t, h.addr, "GET http://plain.test:"+plainPort+"/v1/models HTTP/1.1\r\nHost: plain.test:"+plainPort+"\r\n"+basic("any", "tok-9f8e7d")+"\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("plain forward with a token: %d %q", resp.StatusCode, body)
	}
	if hd := <-got; hd.Get("Proxy-Authorization") != "" {
		t.Errorf("Proxy-Authorization was forwarded: %q", hd.Get("Proxy-Authorization"))
	}
	logs := h.logText()
	for _, secret := range []string{"s3cret-pass", "tok-9f8e7d", base64.StdEncoding.EncodeToString([]byte("alice:s3cret-pass:word"))[:12]} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs hold a credential (%q)", secret)
		}
	}
}

func TestAuthFileErrors(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"empty": "# nothing\n\n", "nouser": "ok:pass\n:hunter2\n"} {
		f := filepath.Join(dir, name)
		os.WriteFile(f, []byte(content), 0o600)
		_, err := loadCredentials(f)
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := loadCredentials(filepath.Join(dir, "absent")); err == nil {
		t.Error("an absent file loaded")
	}
}

// A warning at start when the proxy listens on a non-loopback address
// without authentication; none on loopback, none with authentication.
func TestWarnsWhenOpen(t *testing.T) {
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth")
	os.WriteFile(authFile, []byte("tok\n"), 0o600)
	for _, tc := range []struct {
		listen, auth string
		warn         bool
	}{{"0.0.0.0:3128", "", true}, {"192.0.2.1:3128", "", true}, {"0.0.0.0:3128", authFile, false}, {"127.0.0.1:3128", "", false}, {"[::1]:3128", "", false}} {
		cfg := config.EgressDefaults()
		cfg.CACert, cfg.CAKey, cfg.AuthFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"), tc.auth
		var mu sync.Mutex
		var logs strings.Builder
		p, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(b)
		}), nil))})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- p.Serve(addrListener{ln, netip.MustParseAddrPort(tc.listen)}) }()
		for i := 0; i < 500; i++ {
			mu.Lock()
			up := strings.Contains(logs.String(), "egress proxy is up")
			mu.Unlock()
			if up {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		p.Close()
		<-done
		ln.Close()
		mu.Lock()
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "without authentication")
		mu.Unlock()
		if warned != tc.warn {
			t.Errorf("listen %s auth %v: warned %v, want %v", tc.listen, tc.auth != "", warned, tc.warn)
		}
	}
}

// addrListener is a loopback listener that says it listens elsewhere.
type addrListener struct {
	net.Listener
	addr netip.AddrPort
}

func (l addrListener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.addr) }

// An absurd authority (a 64 KB CONNECT host) is refused at once with a
// bounded body, and no log line echoes it: a 400, or a 431 from the
// header bound (proxy.MaxHeaderBytes) when the request's line and
// headers pass 64 KiB; a long one under the bound is refused with a
// bounded body too.
func TestOversizedAuthority(t *testing.T) {
	h := newHarness(t, harnessOpts{debugLogs: true, tunnel: []string{"*.other.test"}})
	huge := strings.Repeat("a", 64<<10) + ".other.test"
	for _, req := range []struct {
		raw  string
		want int
	}{
		{connect(huge + ":443"), http.StatusRequestHeaderFieldsTooLarge}, // the host twice: line and Host header
		{"GET http://" + huge + "/ HTTP/1.1\r\nHost: " + huge + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"GET /v1/models HTTP/1.1\r\nHost: " + huge + "\r\n\r\n", http.StatusBadRequest},
		{connect(strings.Repeat("b", 300) + ".test:443"), http.StatusBadRequest},
	} {
		resp, body := rawRequest(t, h.addr, req.raw)
		if resp.StatusCode != req.want || len(body) > 512 {
			t.Errorf("%.40q...: %d with a %d-byte body, want %d and at most 512 bytes", req.raw, resp.StatusCode, len(body), req.want)
		}
	}
	long := strings.Repeat("c", 240) + ".test:443" // under the bound, not allowed
	resp, body := rawRequest(t, h.addr, connect(long))
	if resp.StatusCode != http.StatusForbidden || len(body) > 512 {
		t.Errorf("a long authority: %d with a %d-byte body", resp.StatusCode, len(body))
	}
	for _, line := range strings.Split(h.logText(), "\n") {
		if len(line) > 1024 {
			t.Errorf("a %d-byte log line: %.120s...", len(line), line)
		}
	}
	if n := counter(t, h.reg, "tokentap_egress_refused_total", map[string]string{"reason": reasonBadRequest}); n != 2 {
		t.Errorf("refused bad_request = %v, want 2 (the 431s never reach the handler)", n)
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{{"abc", 3, "abc"}, {"abcd", 3, "abc..."}, {"aé", 2, "a..."}, {"日本語", 4, "日..."}, {"日本語", 2, "..."}} {
		if got := clip(tc.in, tc.n); got != tc.want {
			t.Errorf("clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// The address classes: what is internal, and what is not.
func TestInternalAddresses(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "127.9.9.9", "::1", "169.254.169.254", "fe80::1", "10.1.2.3", "172.16.0.1", "192.168.1.1",
		"fd00::1", "100.64.0.1", "0.0.0.0", "0.1.2.3", "::", "224.0.0.1", "ff02::1", "255.255.255.255", "240.0.0.1",
		"::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "fec0::1"} {
		if !internal(netip.MustParseAddr(a)) {
			t.Errorf("%s is not internal", a)
		}
	}
	for _, a := range []string{"8.8.8.8", "192.0.2.10", "2001:4860:4860::8888", "100.128.0.1", "64:ff9b::808:808"} {
		if internal(netip.MustParseAddr(a)) {
			t.Errorf("%s is internal", a)
		}
	}
}
