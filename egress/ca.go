package egress

import (
	"container/list"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// CA is the certificate authority whose certificates the egress proxy
// shows to clients for intercepted hosts.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPath and KeyPath are the files it was loaded from or written to.
	CertPath, KeyPath string
	// Generated says the files did not exist and were created now.
	Generated bool
}

// caValidity is the lifetime of a generated CA.
const caValidity = 10 * 365 * 24 * time.Hour

// DefaultCAPaths are the CA files used when none are configured:
// egress-ca.pem and egress-ca-key.pem in <user config dir>/tokentap
// ($XDG_CONFIG_HOME or ~/.config on Linux).
func DefaultCAPaths() (cert, key string, err error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", "", fmt.Errorf("egress: no user config directory for the CA (%v): give --egress-ca-cert and --egress-ca-key", err)
	}
	dir = filepath.Join(dir, "tokentap")
	return filepath.Join(dir, "egress-ca.pem"), filepath.Join(dir, "egress-ca-key.pem"), nil
}

// LoadOrCreateCA loads the CA from certPath and keyPath, or, when
// neither file exists, generates one (ECDSA P-256, valid ten years,
// name-constrained to the intercepted domains) and writes both: the
// certificate 0644, the key 0600, their directory 0700 if it is
// created. One file without the other is an error: nothing is
// overwritten. A loaded CA must be a CA whose key matches, and its name
// constraints, if any, must permit every intercepted host.
func LoadOrCreateCA(certPath, keyPath string, intercept []string, now time.Time) (*CA, error) {
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		return createCA(certPath, keyPath, intercept, now)
	case errors.Is(certErr, fs.ErrNotExist):
		return nil, fmt.Errorf("egress CA: the key %s exists but the certificate %s does not; restore it, or remove the key to generate a new CA", keyPath, certPath)
	case errors.Is(keyErr, fs.ErrNotExist):
		return nil, fmt.Errorf("egress CA: the certificate %s exists but the key %s does not; restore it, or remove the certificate to generate a new CA", certPath, keyPath)
	}
	ca, err := loadCA(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	if now.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("egress CA %s expired on %s: remove both files to generate a new one", certPath, ca.Cert.NotAfter.Format(time.DateOnly))
	}
	for _, h := range intercept {
		if !ca.permits(strings.TrimPrefix(h, "*.")) {
			return nil, fmt.Errorf("egress CA %s is name-constrained to %s and cannot vouch for intercepted host %q: remove both CA files to generate a new CA for the current intercept list (and trust it again), or give a CA without name constraints",
				certPath, strings.Join(ca.Cert.PermittedDNSDomains, ", "), h)
		}
	}
	return ca, nil
}

// permits reports whether the CA's DNS name constraints allow host.
func (ca *CA) permits(host string) bool {
	c := ca.Cert
	for _, d := range c.ExcludedDNSDomains {
		if domainWithin(host, d) {
			return false
		}
	}
	if len(c.PermittedDNSDomains) == 0 {
		return true
	}
	return slices.ContainsFunc(c.PermittedDNSDomains, func(d string) bool { return domainWithin(host, d) })
}

// domainWithin is RFC 5280's DNS name constraint: host is the domain or
// under it ("." first means strictly under it).
func domainWithin(host, d string) bool {
	host, d = strings.ToLower(host), strings.ToLower(d)
	if strings.HasPrefix(d, ".") {
		return strings.HasSuffix(host, d)
	}
	return host == d || strings.HasSuffix(host, "."+d)
}

func loadCA(certPath, keyPath string) (*CA, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	cblock, _ := pem.Decode(cb)
	if cblock == nil || cblock.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("egress CA: %s holds no PEM CERTIFICATE", certPath)
	}
	cert, err := x509.ParseCertificate(cblock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA %s: %w", certPath, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("egress CA %s is not a CA certificate (basic constraints CA and key usage certSign are needed)", certPath)
	}
	kblock, _ := pem.Decode(kb)
	if kblock == nil {
		return nil, fmt.Errorf("egress CA key: %s holds no PEM block", keyPath)
	}
	key, err := parseKey(kblock)
	if err != nil {
		return nil, fmt.Errorf("egress CA key %s: %w", keyPath, err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("egress CA key %s does not match the certificate %s", keyPath, certPath)
	}
	return &CA{Cert: cert, Key: key, CertPath: certPath, KeyPath: keyPath}, nil
}

func parseKey(b *pem.Block) (crypto.Signer, error) {
	var k any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("unsupported PEM block %q (want PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY)", b.Type)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T cannot sign", k)
	}
	return s, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}

func createCA(certPath, keyPath string, intercept []string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	var permitted []string
	for _, h := range intercept {
		permitted = append(permitted, strings.ToLower(strings.TrimPrefix(h, "*.")))
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"tokentap"}, CommonName: "tokentap egress CA " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		// The CA can vouch only for the intercepted domains, so that its
		// key, if it leaked, could not impersonate any other site to the
		// clients that trust it.
		PermittedDNSDomains: permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{filepath.Dir(certPath), filepath.Dir(keyPath)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
	}
	// The key first, exclusively: a key file is never overwritten.
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	if err := writeNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		os.Remove(keyPath)
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPath: certPath, KeyPath: keyPath, Generated: true}, nil
}

// writeNew creates path with mode and writes b, failing if it exists.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Chmod(mode); err != nil { // whatever the umask did
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// PEM returns the CA certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// mint issues a server certificate for host (a DNS name), valid from
// five minutes ago for validity, never beyond the CA's own validity, with
// a fresh ECDSA P-256 key.
func (ca *CA) mint(host string, now time.Time, validity time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	notBefore := now.Add(-5 * time.Minute)
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// leafCache keeps the minted certificates, most recently used first, at
// most max of them; one is re-minted once three quarters of its validity
// have passed.
type leafCache struct {
	ca       *CA
	max      int
	validity time.Duration
	now      func() time.Time
	minted   func() // counts a mint; may be nil

	mu sync.Mutex
	ll *list.List // of *leafEntry, most recent first
	m  map[string]*list.Element
}

type leafEntry struct {
	host    string
	cert    *tls.Certificate
	renewAt time.Time
}

func newLeafCache(ca *CA, max int, validity time.Duration, now func() time.Time) *leafCache {
	return &leafCache{ca: ca, max: max, validity: validity, now: now, ll: list.New(), m: map[string]*list.Element{}}
}

// get returns host's certificate, minting it when it is not cached or
// due for renewal.
func (c *leafCache) get(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if el, ok := c.m[host]; ok {
		e := el.Value.(*leafEntry)
		if now.Before(e.renewAt) {
			c.ll.MoveToFront(el)
			return e.cert, nil
		}
		c.ll.Remove(el)
		delete(c.m, host)
	}
	cert, err := c.ca.mint(host, now, c.validity)
	if err != nil {
		return nil, err
	}
	if c.minted != nil {
		c.minted()
	}
	renew := now.Add(c.validity * 3 / 4)
	if na := cert.Leaf.NotAfter; renew.After(na) {
		renew = na
	}
	c.m[host] = c.ll.PushFront(&leafEntry{host: host, cert: cert, renewAt: renew})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.m, old.Value.(*leafEntry).host)
	}
	return cert, nil
}

// len is the number of cached certificates.
func (c *leafCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
