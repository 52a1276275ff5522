package tenant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/stream"
)

const secret = "0123456789abcdef0123"

func hashOf(v string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(v))
	return hex.EncodeToString(m.Sum(nil))
}

func TestOffIsNil(t *testing.T) {
	r, err := New(config.Tenant{})
	if err != nil || r != nil {
		t.Fatalf("off: %v %v", r, err)
	}
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer sk-1")
	if r.Identify(req, "chat") != "" || r.Admit("x") != "" || r.Label("x") != "" {
		t.Fatal("a nil resolver named a tenant")
	}
}

// The API key is read where each API's descriptor says, hashed with the
// secret, and only TenantHashHex hex characters of the hash are shown.
func TestAPIKeyIdentity(t *testing.T) {
	r, err := New(config.Tenant{From: "api_key", HashKey: secret, MaxTenants: 3,
		Tenants: []config.DeclaredTenant{{Name: "acme", Match: []string{hashOf("sk-acme")}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, header, value, want string
	}{
		{"/v1/chat/completions", "Authorization", "Bearer sk-1", "t-" + hashOf("sk-1")[:12]},
		{"/v1/chat/completions", "Authorization", "bearer   sk-1", "t-" + hashOf("sk-1")[:12]},
		{"/v1/chat/completions", "Authorization", "Bearer sk-acme", "acme"},
		{"/v1/chat/completions", "api-key", "azure-1", "t-" + hashOf("azure-1")[:12]},
		{"/v1/messages", "x-api-key", "ant-1", "t-" + hashOf("ant-1")[:12]},
		{"/v1beta/models/g:streamGenerateContent?alt=sse", "x-goog-api-key", "goog-1", "t-" + hashOf("goog-1")[:12]},
		{"/v1beta/models/g:streamGenerateContent?alt=sse&key=goog-2", "", "", "t-" + hashOf("goog-2")[:12]},
		{"/v1/chat/completions", "x-api-key", "not-read-for-chat", None},
		{"/v1/chat/completions", "", "", None},
	} {
		req := httptest.NewRequest("POST", c.path, nil)
		if c.header != "" {
			req.Header.Set(c.header, c.value)
		}
		api := stream.Classify(req.URL.Path, "")
		if got := r.Identify(req, string(api.Name)); got != c.want {
			t.Errorf("%s %s: %q: identity %q, want %q", c.path, c.header, c.value, got, c.want)
		}
	}
}

// Declared tenants, then the first max − declared served identities,
// then _other; _none for no identity: at most max + 2 label values.
func TestBound(t *testing.T) {
	r, err := New(config.Tenant{From: "header", Header: "X-Tenant", MaxTenants: 5,
		Tenants: []config.DeclaredTenant{{Name: "acme"}, {Name: "beta", Match: []string{"b1", "b2"}}, {Name: "gamma"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Ephemeral() {
		t.Error("no secret configured, yet not ephemeral")
	}
	labels := map[string]int{}
	ident := func(v string) string {
		req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		if v != "" {
			req.Header.Set("X-Tenant", v)
		}
		return r.Identify(req, "chat")
	}
	// An identity the engine did not serve takes no slot.
	if got := r.Label(ident("refused")); got != Other {
		t.Errorf("unserved identity labelled %q, want _other", got)
	}
	for i := range 50 {
		labels[r.Admit(ident(fmt.Sprintf("random-%d", i)))]++
	}
	for _, v := range []string{"acme", "b1", "b2", "gamma", ""} {
		labels[r.Admit(ident(v))]++
	}
	if len(labels) > 5+2 {
		t.Errorf("%d label values, more than max_tenants + 2: %v", len(labels), labels)
	}
	for _, want := range []string{"acme", "beta", "gamma", None, Other} {
		if labels[want] == 0 {
			t.Errorf("no %q label: %v", want, labels)
		}
	}
	if labels["beta"] != 2 || labels[Other] != 48 {
		t.Errorf("labels %v: want beta twice and 48 _other (2 slots for undeclared)", labels)
	}
	for l := range labels {
		if strings.Contains(l, "random") {
			t.Errorf("a header value %q is a label", l)
		}
	}
	// The admitted keep their label.
	if first := ident("random-0"); r.Label(first) != first || !strings.HasPrefix(first, "t-") || len(first) != 2+config.TenantHashHex {
		t.Errorf("first seen %q labelled %q", first, r.Label(first))
	}
}

func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tenant.key")
	k, err := LoadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 || len(k) != 64 {
		t.Fatalf("created key file mode %v, %d characters", st.Mode().Perm(), len(k))
	}
	again, err := LoadKey(p)
	if err != nil || string(again) != string(k) {
		t.Fatalf("read back %q, %v", again, err)
	}
	os.Chmod(p, 0o644)
	if _, err := LoadKey(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable key file: %v", err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, err := LoadKey(short); err == nil {
		t.Error("a 3-character secret was accepted")
	}
	r, err := New(config.Tenant{From: "api_key", HashKeyFile: filepath.Join(dir, "new.key")})
	if err != nil || r.Ephemeral() {
		t.Fatalf("resolver with a new key file: %v, ephemeral %v", err, r.Ephemeral())
	}
}

// Whatever the headers, the identity is a declared name, _none, or t-
// and 12 hex characters: never the value read.
func FuzzIdentify(f *testing.F) {
	f.Add("Bearer sk-123", "", "/v1/chat/completions")
	f.Add("bearer", "x", "/v1/messages")
	f.Add("Basic dXNlcjpwdw==", "k", "/v1beta/models/g:generateContent?key=abc")
	f.Add("Bearer acme", "acme", "/x")
	r, err := New(config.Tenant{From: "api_key", HashKey: secret, Tenants: []config.DeclaredTenant{{Name: "acme", Match: []string{hashOf("acme")}}}})
	if err != nil {
		f.Fatal(err)
	}
	h, _ := New(config.Tenant{From: "header", Header: "X-Tenant", Tenants: []config.DeclaredTenant{{Name: "acme"}}})
	f.Fuzz(func(t *testing.T, auth, other, path string) {
		req := httptest.NewRequest("POST", "/", nil)
		req.URL.RawQuery = strings.TrimPrefix(path, "?")
		req.Header["Authorization"] = []string{auth}
		req.Header["X-Api-Key"] = []string{other}
		req.Header["X-Tenant"] = []string{other}
		for _, res := range []*Resolver{r, h} {
			for _, api := range []string{"chat", "messages", "gemini", "other"} {
				id := res.Identify(req, api)
				ok := id == "acme" || id == None || (strings.HasPrefix(id, "t-") && len(id) == 2+config.TenantHashHex && strings.Trim(id[2:], "0123456789abcdef") == "")
				if !ok {
					t.Fatalf("identity %q", id)
				}
			}
		}
	})
}

// The per-request cost of tenants: one identification at arrival and one
// bound at the end (docs/performance.md).
func BenchmarkIdentifyAndAdmit(b *testing.B) {
	r, _ := New(config.Tenant{From: "api_key", HashKey: secret})
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer sk-proj-0123456789abcdef0123456789abcdef")
	b.ReportAllocs()
	for b.Loop() {
		r.Admit(r.Identify(req, "chat"))
	}
}
