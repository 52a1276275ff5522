// Package tenant says who each request is for: a tenant identity taken
// from a configured request header, or from a keyed hash of the API key
// the request carries, bounded like the model label (docs/config.md,
// tenant; docs/metrics.md, tenant). The key and the header's value are
// never kept: an identity is a declared tenant's name, or "t-" and the
// first config.TenantHashHex hex characters of the value's HMAC-SHA256.
package tenant

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/tokentap/tokentap/config"
	keyfile "github.com/tokentap/tokentap/internal/secret"
	"github.com/tokentap/tokentap/stream"
)

// Label values that name no tenant (config.TenantOther, TenantNone).
const (
	Other = config.TenantOther
	None  = config.TenantNone
)

// hashPrefix starts the identity of an undeclared tenant.
const hashPrefix = "t-"

// Resolver identifies requests' tenants and bounds the label. A nil
// *Resolver is off: Identify returns "" and so do Admit and Label.
//
// The label values are: the declared tenants' names (always), the
// identities of the first max − declared tenants that the engine served
// (Admit), "_other" for every later one, and "_none" for requests with
// no identity: at most max + 2. A client cannot take a slot with a key
// the engine refuses (a 401 is not served). It is safe for concurrent
// use; it is consulted once per request at its start (Identify) and once
// at its end (Admit or Label), never per token.
type Resolver struct {
	from     string // "header" or "api_key"
	header   string // canonical header name (from header)
	key      []byte // the HMAC secret
	declared map[string]string
	names    map[string]struct{}
	room     int // slots for undeclared identities

	ephemeral bool // no secret configured: a random one, this process's

	macs sync.Pool // hash.Hash: HMAC-SHA256 keyed with key, reset

	mu       sync.RWMutex
	admitted map[string]struct{}
}

// New returns the resolver of cfg (valid), or nil when tenants are off.
// It reads, or creates, cfg.HashKeyFile; with no secret configured it
// hashes with a random one kept in memory (Ephemeral).
func New(cfg config.Tenant) (*Resolver, error) {
	if !cfg.On() {
		return nil, nil
	}
	r := &Resolver{from: cfg.From, header: http.CanonicalHeaderKey(cfg.Header), declared: map[string]string{},
		names: map[string]struct{}{}, admitted: map[string]struct{}{}}
	switch {
	case cfg.HashKey != "":
		r.key = []byte(cfg.HashKey)
	case cfg.HashKeyFile != "":
		k, err := LoadKey(cfg.HashKeyFile)
		if err != nil {
			return nil, err
		}
		r.key = k
	default:
		r.key = make([]byte, 32)
		_, _ = rand.Read(r.key)
		r.ephemeral = true
	}
	for _, d := range cfg.Tenants {
		r.names[d.Name] = struct{}{}
		match := d.Match
		if cfg.From == "header" && len(match) == 0 {
			match = []string{d.Name}
		}
		for _, m := range match {
			if cfg.From == "api_key" {
				m = hashPrefix + strings.ToLower(strings.TrimPrefix(m, hashPrefix))[:config.TenantHashHex]
			}
			r.declared[m] = d.Name
		}
	}
	r.room = max(cfg.Max()-len(cfg.Tenants), 0)
	r.macs.New = func() any { return hmac.New(sha256.New, r.key) }
	return r, nil
}

// Ephemeral reports whether no secret was configured: undeclared
// tenants' identities then change when the process restarts, and differ
// between replicas.
func (t *Resolver) Ephemeral() bool { return t != nil && t.ephemeral }

// LoadKey reads the secret kept in path, creating it when path does not
// exist, by the rules of package internal/secret (the file's text, at
// least 32 bytes, a regular file only its owner may read; created
// atomically with 32 random bytes in hex, never over another file).
func LoadKey(path string) ([]byte, error) {
	k, err := keyfile.Load(path)
	if err != nil {
		return nil, fmt.Errorf("tenant.hash_key_file: %w", err)
	}
	return k, nil
}

// Identify returns the identity of request r of the given API: a
// declared tenant's name, "t-" and the hash of its header value or API
// key, or "_none" when it carries neither. It reads the headers once and
// computes one HMAC; the value it read is not kept.
func (t *Resolver) Identify(r *http.Request, api string) string {
	if t == nil {
		return ""
	}
	var v string
	if t.from == "header" {
		v = r.Header.Get(t.header)
		if name, ok := t.declared[v]; ok && v != "" {
			return name
		}
	} else {
		v = APIKey(r, stream.LookupAPI(api))
	}
	if v == "" {
		return None
	}
	id := t.Hash(v)
	if name, ok := t.declared[id]; ok {
		return name
	}
	return id
}

// Hash returns the identity of value v when no tenant declares it: "t-"
// and the first config.TenantHashHex hex characters of HMAC-SHA256(key, v).
// The keyed hashes are pooled: a new one costs more allocations than the
// rest of a request's tenant work.
func (t *Resolver) Hash(v string) string {
	m := t.macs.Get().(hash.Hash)
	io.WriteString(m, v)
	var sum [sha256.Size]byte
	s := m.Sum(sum[:0])
	m.Reset()
	t.macs.Put(m)
	var out [len(hashPrefix) + config.TenantHashHex]byte
	copy(out[:], hashPrefix)
	hex.Encode(out[len(hashPrefix):], s[:config.TenantHashHex/2])
	return string(out[:])
}

// APIKey returns the API key request r carries for api (nil: any API):
// the first of api's key headers that is set (a bearer token with its
// scheme removed), else its key query parameter; "" when none.
func APIKey(r *http.Request, api *stream.API) string {
	for _, h := range api.Keys() {
		v := strings.TrimSpace(r.Header.Get(h))
		if v == "" {
			continue
		}
		if http.CanonicalHeaderKey(h) == "Authorization" || http.CanonicalHeaderKey(h) == "Proxy-Authorization" {
			scheme, token, ok := strings.Cut(v, " ")
			if ok && strings.EqualFold(scheme, "Bearer") {
				v = strings.TrimSpace(token)
			}
		}
		if v != "" {
			return v
		}
	}
	if api != nil && api.KeyQuery != "" && r.URL != nil {
		return r.URL.Query().Get(api.KeyQuery)
	}
	return ""
}

// Label returns the label value of identity id without admitting it:
// id itself when it is declared or admitted, "_other" otherwise.
func (t *Resolver) Label(id string) string {
	if t == nil || id == "" {
		return ""
	}
	if id == None {
		return None
	}
	if _, ok := t.names[id]; ok {
		return id
	}
	t.mu.RLock()
	_, ok := t.admitted[id]
	t.mu.RUnlock()
	if ok {
		return id
	}
	return Other
}

// Admit returns the label value of identity id of a request the engine
// served, admitting it while there is room.
func (t *Resolver) Admit(id string) string {
	if lab := t.Label(id); lab != Other || !strings.HasPrefix(id, hashPrefix) {
		return lab
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.admitted[id]; ok {
		return id
	}
	if len(t.admitted) >= t.room {
		return Other
	}
	t.admitted[id] = struct{}{}
	return id
}
