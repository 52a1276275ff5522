package egress

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// credentials are the proxy credentials of egress.auth_file, kept as
// SHA-256 digests: compared in constant time whatever their length, and
// never logged.
type credentials struct {
	pairs  [][sha256.Size]byte // of "user:password"
	tokens [][sha256.Size]byte // of a token, matched against the password
}

// loadCredentials reads an auth file: "user:password" or a token alone
// per line; blank lines and lines starting with '#' skipped. Its errors
// name the file and the line, never the line's text.
func loadCredentials(path string) (*credentials, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("egress.auth_file: %w", err)
	}
	c := &credentials{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, _, isPair := strings.Cut(line, ":")
		switch {
		case isPair && user == "":
			return nil, fmt.Errorf("egress.auth_file %s: line %d: an empty user name", path, n)
		case isPair:
			c.pairs = append(c.pairs, sha256.Sum256([]byte(line)))
		default:
			c.tokens = append(c.tokens, sha256.Sum256([]byte(line)))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("egress.auth_file %s: %w", path, err)
	}
	if len(c.pairs)+len(c.tokens) == 0 {
		return nil, fmt.Errorf("egress.auth_file %s: no credentials in it", path)
	}
	return c, nil
}

// check says whether a Proxy-Authorization header value carries
// credentials from the file. Every entry is compared, whatever matched.
func (c *credentials) check(header string) bool {
	scheme, b64, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return false
	}
	_, password, _ := bytes.Cut(raw, []byte(":"))
	pair, pass := sha256.Sum256(raw), sha256.Sum256(password)
	match := 0
	for i := range c.pairs {
		match |= subtle.ConstantTimeCompare(pair[:], c.pairs[i][:])
	}
	for i := range c.tokens {
		match |= subtle.ConstantTimeCompare(pass[:], c.tokens[i][:])
	}
	return match == 1
}

// authorized says whether r may use the proxy: always, when there is no
// auth file.
func (p *Proxy) authorized(r *http.Request) bool {
	return p.auth == nil || p.auth.check(r.Header.Get("Proxy-Authorization"))
}
