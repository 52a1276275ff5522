package config

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tokentap/tokentap/internal/secret"
	"github.com/tokentap/tokentap/stream"
)

// Capture is the workload capture section (docs/capture.md): one
// Mooncake trace line per finished live request, without text.
//
// The zero value is off. With a file set, the zero value of every other
// field means its default: the secret in .tokentap-capture.key beside
// the file, 512-token blocks of 4 bytes a token, no session id,
// tokentap's fields on the line, a queue of 4096 lines, a hold of 16384,
// 2 × 131072 remembered block ids, a 5 s settle and ids numbered per
// file.
type Capture struct {
	// File is the trace file; empty: capture off.
	File string `yaml:"file"`
	// SecretFile holds the key of the prompt digests (its text, at least
	// 32 bytes, mode 0600: package internal/secret's rules), generated
	// there when missing; empty: .tokentap-capture.key in the trace's
	// directory.
	SecretFile string `yaml:"secret_file"`
	// BlockSize is the tokens per hash id (AIPerf's --isl-block-size,
	// GuideLLM's hash_id_block_size).
	BlockSize int `yaml:"block_size"`
	// BytesPerToken maps token blocks to bytes of the prompt.
	BytesPerToken float64 `yaml:"bytes_per_token"`
	// SessionHeader is the request header naming the conversation;
	// empty: no session_id.
	SessionHeader string `yaml:"session_header"`
	// Meta is "inline" (tokentap's fields in a "tokentap" member of each
	// line) or "none" (the Mooncake keys alone).
	Meta string `yaml:"meta"`
	// Queue bounds the lines waiting for the writer; Hold the finished
	// requests waiting for earlier arrivals; MaxIDs each generation of
	// the id table.
	Queue  int `yaml:"queue"`
	Hold   int `yaml:"hold"`
	MaxIDs int `yaml:"max_ids"`
	// Settle is how long a finished request waits, at least, for one
	// that arrived before it and whose body is still being read.
	Settle time.Duration `yaml:"settle"`
	// IDs is "file" (hash ids numbered per file, the default) or "fleet"
	// (each id the keyed digest's first 53 bits, equal on every replica
	// with the same secret_file, block_size and bytes_per_token, and each
	// line names its replica and its file's start: `sidecar capture
	// merge` joins the replicas' files exactly); empty: file.
	IDs string `yaml:"ids"`
	// Replica names this sidecar on fleet lines; empty: the POD_NAME
	// environment variable, else the host name (ReplicaName).
	Replica string `yaml:"replica"`
}

// MaxReplicaBytes bounds capture.replica: it is written on every line.
const MaxReplicaBytes = 253

// ReplicaName returns the replica's name: Replica, else getenv's
// POD_NAME, else hostname's answer, else "".
func (c Capture) ReplicaName(getenv func(string) string, hostname func() (string, error)) string {
	if c.Replica != "" {
		return c.Replica
	}
	if p := getenv("POD_NAME"); p != "" && len(p) <= MaxReplicaBytes {
		return p
	}
	if h, err := hostname(); err == nil && len(h) <= MaxReplicaBytes {
		return h
	}
	return ""
}

// Secret returns the secret file's path: SecretFile, or its default
// beside File; "" with neither (the live reuse alone: a secret drawn in
// memory for the process's life).
func (c Capture) Secret() string {
	if c.SecretFile != "" {
		return c.SecretFile
	}
	if c.File == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(c.File), ".tokentap-capture.key")
}

func (c *Capture) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.File, "capture", c.File, "workload capture: write one Mooncake trace line per finished live request to this file (empty: off; docs/capture.md)")
	fs.StringVar(&c.SessionHeader, "capture.session-header", c.SessionHeader, "workload capture: request header naming the conversation (empty: no session_id)")
	fs.StringVar(&c.SecretFile, "capture.secret-file", c.SecretFile, "workload capture: the prompt digests' secret file, 0600 (empty: .tokentap-capture.key beside the capture)")
	fs.StringVar(&c.IDs, "capture.ids", c.IDs, "workload capture: file (hash ids numbered per file) or fleet (equal across the replicas sharing the secret file; docs/capture.md) (empty: file)")
}

// Validate returns one error per problem.
func (c Capture) Validate() []error { return c.validate(false) }

// validate is Validate where the live reuse (reuse:) may be on: without
// a file, the block ids are then computed still (docs/capture.md, "Live
// reuse"), and the settings that shape them (secret_file, block_size,
// bytes_per_token, hold, settle) are read; those of the file alone are
// refused.
func (c Capture) validate(reuse bool) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.File == "" {
		ids := Capture{SecretFile: c.SecretFile, BlockSize: c.BlockSize, BytesPerToken: c.BytesPerToken, Hold: c.Hold, Settle: c.Settle}
		switch {
		case !reuse && c != (Capture{}):
			bad("capture: settings given but capture.file (--capture) is empty: the capture is off")
			return errs
		case !reuse:
			return errs
		case c != ids:
			bad("capture: session_header, meta, queue and max_ids given but capture.file (--capture) is empty: only the live reuse is on")
		}
	}
	paths := []struct{ name, path string }{{"capture.file", c.File}, {"capture.secret_file", c.Secret()}}
	if c.File == "" {
		paths = paths[1:]
	}
	if c.File != "" || c.SecretFile != "" {
		for _, p := range paths {
			if st, err := os.Stat(filepath.Dir(p.path)); err != nil || !st.IsDir() {
				bad("%s: directory of %q does not exist", p.name, p.path)
			}
		}
		if err := secret.Check(c.Secret()); err != nil {
			bad("capture.secret_file: %v", err)
		}
	}
	if st, err := os.Stat(c.File); c.File != "" && err == nil && !st.Mode().IsRegular() {
		bad("capture.file: %q is not a regular file", c.File)
	}
	if c.BlockSize < 0 || c.BlockSize > 1<<20 {
		bad("capture.block_size: must be 1 to %d tokens (0: 512), got %d", 1<<20, c.BlockSize)
	}
	if c.BytesPerToken < 0 || c.BytesPerToken > 64 {
		bad("capture.bytes_per_token: must be above 0 and at most 64 (0: 4), got %v", c.BytesPerToken)
	}
	if c.SessionHeader != "" && !validHeaderName(c.SessionHeader) {
		bad("capture.session_header: %q is not a header name", c.SessionHeader)
	}
	if credentialHeader(c.SessionHeader) {
		bad("capture.session_header: %q carries credentials; name the conversation header instead", c.SessionHeader)
	}
	switch c.Meta {
	case "", "inline", "none":
	default:
		bad("capture.meta: must be inline or none, got %q", c.Meta)
	}
	if c.Queue < 0 || c.Hold < 0 || c.MaxIDs < 0 {
		bad("capture.queue, capture.hold, capture.max_ids: must not be negative (0: the default)")
	}
	if c.Queue > 1<<20 || c.Hold > 1<<20 || c.MaxIDs > 1<<24 {
		bad("capture.queue and capture.hold: at most %d; capture.max_ids: at most %d (they bound memory)", 1<<20, 1<<24)
	}
	if c.Settle < 0 || c.Settle > 10*time.Minute {
		bad("capture.settle: must be 0 to 10m, got %v", c.Settle)
	}
	switch c.IDs {
	case "", "file":
		if c.Replica != "" {
			bad("capture.replica: given but capture.ids is not fleet: only fleet lines name their replica")
		}
	case "fleet":
		if c.Meta == "none" {
			bad("capture.ids: fleet needs capture.meta inline (each line's replica and start travel in its tokentap member)")
		}
	default:
		bad("capture.ids: must be file or fleet, got %q", c.IDs)
	}
	if len(c.Replica) > MaxReplicaBytes || strings.IndexFunc(c.Replica, func(r rune) bool { return r < ' ' || r == 0x7f || r == utf8.RuneError }) >= 0 {
		bad("capture.replica: at most %d bytes of printable UTF-8, got %q", MaxReplicaBytes, c.Replica)
	}
	return errs
}

// validHeaderName reports whether s is an HTTP header field name.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 127 || r <= ' ' || r == ':' || r == '(' || r == ')' || r == '"' || r == ',' || r == '/' || r == ';' || r == '<' || r == '>' || r == '=' || r == '?' || r == '@' || r == '[' || r == ']' || r == '\\' || r == '{' || r == '}' {
			return false
		}
	}
	return true
}

// credentialHeader reports whether the header carries credentials: an
// API key header of some API (stream.API's KeyHeaders), a proxy's
// credentials or cookies.
func credentialHeader(name string) bool {
	name = http.CanonicalHeaderKey(name)
	if name == "Proxy-Authorization" || name == "Cookie" {
		return true
	}
	for _, a := range stream.APIs() {
		for _, h := range a.Keys() {
			if http.CanonicalHeaderKey(h) == name {
				return true
			}
		}
	}
	return false
}
