package egress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
)

// Absent CA files are generated: an ECDSA P-256 CA, the key file 0600,
// name-constrained to the intercepted domains; the path and how to trust
// it are logged once; a second start loads the same CA.
func TestCAGeneratedOnceAndReloaded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new") // does not exist yet
	var logs bytes.Buffer
	cfg := config.EgressDefaults()
	cfg.Intercept = []string{"api.openai.test", "*.azure.test"}
	cfg.CACert, cfg.CAKey = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	p, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ca := p.CA()
	if !ca.Generated {
		t.Fatal("not generated")
	}
	st, err := os.Stat(cfg.CAKey)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("CA directory mode %v, want 0700", st.Mode().Perm())
	}
	k, ok := ca.Key.(*ecdsa.PrivateKey)
	if !ok || k.Curve != elliptic.P256() {
		t.Fatalf("key %T, want ECDSA P-256", ca.Key)
	}
	if c := ca.Cert; !c.IsCA || !c.MaxPathLenZero || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("not a CA that signs only leaves: %+v", c)
	}
	if got := strings.Join(ca.Cert.PermittedDNSDomains, ","); got != "api.openai.test,azure.test" {
		t.Errorf("name constraints %q", got)
	}
	out := logs.String()
	if n := strings.Count(out, "egress CA generated"); n != 1 {
		t.Errorf("the CA was announced %d times:\n%s", n, out)
	}
	for _, w := range []string{cfg.CACert, "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "OS store"} {
		if !strings.Contains(out, w) {
			t.Errorf("the log does not say %q:\n%s", w, out)
		}
	}
	if b := p.Bundle(); b != "" {
		pb, _ := os.ReadFile(b)
		if !bytes.HasSuffix(pb, ca.PEM()) || len(pb) <= len(ca.PEM()) {
			t.Errorf("bundle %s does not end with the CA after the system roots", b)
		}
	}

	// A second start loads it.
	logs.Reset()
	p2, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if p2.CA().Generated || !bytes.Equal(p2.CA().Cert.Raw, ca.Cert.Raw) {
		t.Fatal("the second start did not load the same CA")
	}
	if !strings.Contains(logs.String(), "egress CA loaded") {
		t.Errorf("log: %s", logs.String())
	}

	// A host the CA's name constraints do not permit: refused, with the
	// remedy.
	cfg.Intercept = append(cfg.Intercept, "api.anthropic.test")
	if _, err := New(Options{Config: cfg}); err == nil || !strings.Contains(err.Error(), "name-constrained") {
		t.Errorf("err %v, want the name constraints named", err)
	}
}

// One CA file without the other is an error, and nothing is overwritten.
func TestCAHalfPresent(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	os.WriteFile(cert, []byte("not touched"), 0o644)
	if _, err := LoadOrCreateCA(cert, key, []string{"a.test"}, time.Now()); err == nil || !strings.Contains(err.Error(), "does not") {
		t.Fatalf("err %v", err)
	}
	if b, _ := os.ReadFile(cert); string(b) != "not touched" {
		t.Fatal("the certificate was overwritten")
	}
	if _, err := os.Stat(key); err == nil {
		t.Fatal("a key was written beside a foreign certificate")
	}
}

// A given CA is used as it is: any key type the PEM holds, no name
// constraints needed; a key that is not the certificate's is refused.
func TestCAGivenIsUsed(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "corp CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	kder, _ := x509.MarshalECPrivateKey(key)
	cert, kf := filepath.Join(dir, "corp.pem"), filepath.Join(dir, "corp.key")
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	ca, err := LoadOrCreateCA(cert, kf, []string{"anything.test", "*.else.test"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.mint("anything.test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "anything.test", Roots: pool}); err != nil {
		t.Fatalf("minted leaf does not verify: %v", err)
	}

	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	oder, _ := x509.MarshalPKCS8PrivateKey(other)
	os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: oder}), 0o600)
	if _, err := LoadOrCreateCA(cert, kf, nil, time.Now()); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("err %v, want the mismatch named", err)
	}
}

// Minted leaves are short-lived, verify against the CA for their host
// only, are cached (bounded, least recently used out) and re-minted when
// three quarters of their validity have passed.
func TestLeafCache(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	ca, err := LoadOrCreateCA(filepath.Join(t.TempDir(), "c.pem"), filepath.Join(t.TempDir(), "k.pem"), []string{"*.test"}, now)
	if err != nil {
		t.Fatal(err)
	}
	clock := now
	minted := 0
	c := newLeafCache(ca, 2, 24*time.Hour, func() time.Time { return clock })
	c.minted = func() { minted++ }
	a1, _ := c.get("a.test")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := a1.Leaf.Verify(x509.VerifyOptions{DNSName: "a.test", Roots: pool, CurrentTime: now}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
	if _, err := a1.Leaf.Verify(x509.VerifyOptions{DNSName: "b.test", Roots: pool, CurrentTime: now}); err == nil {
		t.Fatal("leaf for a.test verifies for b.test")
	}
	if v := a1.Leaf.NotAfter.Sub(a1.Leaf.NotBefore); v > 24*time.Hour+5*time.Minute {
		t.Errorf("leaf valid for %v", v)
	}
	if k, ok := a1.PrivateKey.(*ecdsa.PrivateKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("leaf key %T", a1.PrivateKey)
	}
	if a2, _ := c.get("a.test"); a2 != a1 || minted != 1 {
		t.Fatalf("not cached (minted %d)", minted)
	}
	c.get("b.test")
	c.get("a.test") // a is now the most recent
	c.get("c.test") // evicts b
	if c.len() != 2 || minted != 3 {
		t.Fatalf("cache holds %d, minted %d; want 2, 3", c.len(), minted)
	}
	if a3, _ := c.get("a.test"); a3 != a1 {
		t.Error("a was evicted instead of b")
	}
	c.get("b.test")
	if minted != 4 {
		t.Errorf("b was not re-minted after eviction (minted %d)", minted)
	}
	clock = now.Add(18*time.Hour + time.Second) // past three quarters
	if a4, _ := c.get("a.test"); a4 == a1 || minted != 5 {
		t.Error("a was not renewed")
	}
}

func TestMatcher(t *testing.T) {
	m := newMatcher([]string{"api.openai.com", "*.openai.azure.com", "*.eu.openai.azure.com", "API.Anthropic.com"})
	for host, want := range map[string]string{
		"api.openai.com":           "api.openai.com",
		"API.OPENAI.COM.":          "api.openai.com",
		"x.openai.azure.com":       "*.openai.azure.com",
		"a.b.openai.azure.com":     "*.openai.azure.com",
		"x.eu.openai.azure.com":    "*.eu.openai.azure.com",
		"api.anthropic.com":        "api.anthropic.com",
		"openai.azure.com":         "",
		"evilopenai.azure.com":     "",
		"api.openai.com.evil.test": "",
		"sub.api.openai.com":       "",
		"127.0.0.1":                "",
		"":                         "",
	} {
		got, ok := m.rule(host)
		if got != want || ok != (want != "") {
			t.Errorf("%q: %q %v, want %q", host, got, ok, want)
		}
	}
	if h, p := splitHostPort("API.x.test:8443"); h != "api.x.test" || p != "8443" {
		t.Errorf("%q %q", h, p)
	}
	if a := targetAuthority("https", "h.test", "443"); a != "h.test" {
		t.Error(a)
	}
	if a := targetAuthority("http", "h.test", "443"); a != "h.test:443" {
		t.Error(a)
	}
}
