package config

import (
	"encoding/hex"
	"flag"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/tokentap/tokentap/internal/secret"
)

// Tenant is the tenant section (docs/config.md, tenant): who each
// request is for, as a bounded label on records, spans, the SLO
// counters and /slo (docs/slo.md, per tenant).
//
// The zero value is off: no tenant is resolved and nothing carries one.
type Tenant struct {
	// From is where the identity comes from: "header" (the value of
	// Header), "api_key" (a keyed hash of the API key the request
	// carries), or "" (off).
	From string `yaml:"from"`
	// Header is the request header that names the tenant (From header).
	Header string `yaml:"header"`
	// MaxTenants bounds the tenant label values that name a tenant:
	// the declared ones first, then the first identities seen; later
	// ones are "_other". Zero means DefaultMaxTenants.
	MaxTenants int `yaml:"max_tenants"`
	// HashKeyFile keeps the secret of the keyed hash: read when it
	// exists (its text, at least 32 bytes, readable by its owner alone,
	// mode 0600: package internal/secret's rules), created with a random
	// secret otherwise.
	HashKeyFile string `yaml:"hash_key_file"`
	// HashKey is the secret itself, instead of a file (its environment
	// twin is TOKENTAP_TENANT_HASH_KEY); never printed.
	HashKey string `yaml:"hash_key"`
	// Tenants are the declared tenants, each always its own label value.
	Tenants []DeclaredTenant `yaml:"tenants"`
}

// DeclaredTenant is a tenant named in the configuration.
type DeclaredTenant struct {
	// Name is its label value.
	Name string `yaml:"name"`
	// Match lists what identifies it: header values (From header; empty
	// means the name itself), or key hashes (From api_key: the hex the
	// sidecar shows for an undeclared key, TenantHashHex characters, or
	// more of the full HMAC-SHA256, compared on the first TenantHashHex).
	Match []string `yaml:"match"`
}

// DefaultMaxTenants is the tenant label bound when max_tenants is 0.
const DefaultMaxTenants = 20

// MaxTenantsLimit bounds max_tenants: each tenant is a label value of
// every per-tenant series and a row per SLO on /slo.
const MaxTenantsLimit = 200

// TenantHashHex is how many hex characters of a tenant's keyed hash are
// shown (48 bits): in the label of an undeclared tenant, "t-" and these.
const TenantHashHex = 12

// Tenant label values that name no tenant.
const (
	// TenantOther labels the identities past the bound.
	TenantOther = "_other"
	// TenantNone labels requests that carry no identity (no header, no
	// API key).
	TenantNone = "_none"
)

var (
	tenantName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	tenantHashed = regexp.MustCompile(`^t-[0-9a-f]+$`)
)

// On reports whether tenants are resolved.
func (t Tenant) On() bool { return t.From != "" }

// Max returns the effective bound (MaxTenants, or DefaultMaxTenants).
func (t Tenant) Max() int {
	if t.MaxTenants == 0 {
		return DefaultMaxTenants
	}
	return t.MaxTenants
}

func (t *Tenant) bind(fs *flag.FlagSet) {
	fs.StringVar(&t.From, "tenant.from", t.From, "tenant identity: header, api_key (a keyed hash of the API key), or empty for none")
	fs.StringVar(&t.Header, "tenant.header", t.Header, "request header naming the tenant (--tenant.from=header)")
	fs.IntVar(&t.MaxTenants, "tenant.max-tenants", t.MaxTenants, "tenant label values naming a tenant, declared ones first, before the rest become _other (0 = 20)")
	fs.StringVar(&t.HashKeyFile, "tenant.hash-key-file", t.HashKeyFile, "file keeping the tenant hash's secret (mode 0600; created when missing)")
	fs.StringVar(&t.HashKey, "tenant.hash-key", t.HashKey, "the tenant hash's secret itself (prefer TOKENTAP_TENANT_HASH_KEY or the file)")
}

// Validate returns one error per problem, naming the field.
func (t Tenant) Validate() []error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	switch t.From {
	case "":
		if t.Header != "" || len(t.Tenants) > 0 || t.HashKeyFile != "" || t.HashKey != "" || t.MaxTenants != 0 {
			bad("tenant: settings given but tenant.from is empty (tenants are off): set from to header or api_key")
		}
		return errs
	case "header":
		if t.Header == "" {
			bad("tenant.header: required with from: header")
		} else if strings.ContainsAny(t.Header, " \t:") || http.CanonicalHeaderKey(t.Header) == "" {
			bad("tenant.header: %q is not a header name", t.Header)
		}
	case "api_key":
		if t.Header != "" {
			bad("tenant.header: only with from: header (from: api_key reads the API's own key headers)")
		}
		if len(t.Tenants) > 0 && t.HashKeyFile == "" && t.HashKey == "" {
			bad("tenant: declared tenants match key hashes, which need a stable secret: set hash_key_file or hash_key (TOKENTAP_TENANT_HASH_KEY)")
		}
	default:
		bad("tenant.from: must be header, api_key or empty, got %q", t.From)
	}
	if t.HashKeyFile != "" && t.HashKey != "" {
		bad("tenant: hash_key_file and hash_key both set; set one")
	}
	if t.HashKeyFile != "" {
		if err := secret.Check(t.HashKeyFile); err != nil {
			bad("tenant.hash_key_file: %v", err)
		}
	}
	if t.HashKey != "" && len(t.HashKey) < 16 {
		bad("tenant.hash_key: at least 16 characters, got %d", len(t.HashKey))
	}
	if t.MaxTenants < 0 || t.MaxTenants > MaxTenantsLimit {
		bad("tenant.max_tenants: must be in [1,%d] (0 = %d), got %d", MaxTenantsLimit, DefaultMaxTenants, t.MaxTenants)
	}
	if len(t.Tenants) > t.Max() {
		bad("tenant.tenants: %d declared, more than max_tenants %d (declared tenants count against it)", len(t.Tenants), t.Max())
	}
	names := map[string]bool{}
	matches := map[string]string{}
	for i, d := range t.Tenants {
		switch {
		case !tenantName.MatchString(d.Name):
			bad("tenant.tenants[%d].name: %q must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", i, d.Name)
		case tenantHashed.MatchString(d.Name):
			bad("tenant.tenants[%d].name: %q has the form of an undeclared tenant's label (t-<hex>)", i, d.Name)
		case names[d.Name]:
			bad("tenant.tenants[%d].name: %q declared twice", i, d.Name)
		}
		names[d.Name] = true
		match := d.Match
		if t.From == "header" && len(match) == 0 {
			match = []string{d.Name}
		}
		if t.From == "api_key" && len(match) == 0 {
			bad("tenant.tenants[%d].match: a key hash is required with from: api_key", i)
		}
		for _, m := range match {
			key := m
			if t.From == "api_key" {
				if b, err := hex.DecodeString(strings.TrimPrefix(m, "t-")); err != nil || len(strings.TrimPrefix(m, "t-")) < TenantHashHex || len(b) > 32 {
					bad("tenant.tenants[%d].match: %q is not a key hash (at least %d hex characters, as /slo shows them after t-)", i, m, TenantHashHex)
					continue
				}
				key = strings.ToLower(strings.TrimPrefix(m, "t-"))[:TenantHashHex]
			} else if m == "" {
				bad("tenant.tenants[%d].match: empty header value", i)
				continue
			}
			if o, ok := matches[key]; ok && o != d.Name {
				bad("tenant.tenants[%d].match: %q also identifies %q", i, m, o)
			}
			matches[key] = d.Name
		}
	}
	return errs
}
