// Package secret loads, or creates once, a secret kept in a file: the
// capture's digest key (capture.secret_file) and the tenant hash's key
// (tenant.hash_key_file) follow the same rules, these.
//
//   - The secret is the file's text with the white space around it
//     trimmed, at least MinBytes bytes and at most MaxBytes. Any text
//     works (a passphrase, `openssl rand -hex 32`); the bytes of the
//     text are the key, nothing is decoded.
//   - The file must be a regular file (a symbolic link to one, as a
//     Kubernetes secret volume mounts it, is followed) that only its
//     owner may read or write: a mode with any group or other bit
//     (0o077) is refused (chmod 600).
//   - When path does not exist, a new secret is generated: 32 random
//     bytes written as 64 hex digits and a newline, into a temporary
//     file beside path (mode 0600, synced), then linked to path, which
//     is never overwritten: the file appears whole or not at all, and a
//     half-written temporary file is removed. When another process
//     created path in the meantime, its secret is read instead.
package secret

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// MinBytes is the shortest secret accepted: 32 bytes of text.
const MinBytes = 32

// MaxBytes bounds the file read: a secret is never longer.
const MaxBytes = 4096

// generated is the random bytes of a new secret (written in hex).
const generated = 32

// Load returns the secret kept in path, creating it first when path does
// not exist (see the package's rules). Its errors name path and the rule
// broken; callers prefix them with their configuration key.
func Load(path string) ([]byte, error) {
	key, err := read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return create(path)
	}
	return key, err
}

// Check reports what Load would refuse in an existing file at path
// (nil when path does not exist: Load creates it), without creating
// anything: the configuration's validation names it with the other
// problems (exit 2).
func Check(path string) error {
	_, err := read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func read(path string) ([]byte, error) {
	st, err := os.Stat(path) // before opening: opening a FIFO would block
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v)", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s is mode %#o: others than its owner may use it; want 0600 (chmod 600)", path, perm)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if again, err := f.Stat(); err != nil || !os.SameFile(st, again) {
		return nil, fmt.Errorf("%s changed while it was read; try again", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key := bytes.TrimSpace(b)
	switch {
	case len(b) > MaxBytes:
		return nil, fmt.Errorf("%s holds more than %d bytes; a secret is %d to %d bytes of text", path, MaxBytes, MinBytes, MaxBytes)
	case len(key) < MinBytes:
		return nil, fmt.Errorf("%s holds %d bytes of text; at least %d (e.g. openssl rand -hex 32 > %s)", path, len(key), MinBytes, path)
	}
	return key, nil
}

// create writes a new secret to path atomically, never over a file there.
func create(path string) ([]byte, error) {
	raw := make([]byte, generated)
	rand.Read(raw) // never fails (crypto/rand)
	key := []byte(hex.EncodeToString(raw))
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())           // the temporary name goes whatever happens
	_, err = tmp.Write(append(key, '\n')) // CreateTemp's mode is 0600
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp.Name(), path) // fails if path exists: never overwritten
	}
	switch {
	case errors.Is(err, fs.ErrExist):
		return read(path) // created by another process meanwhile
	case err != nil:
		return nil, fmt.Errorf("creating %s: %w", path, err)
	}
	return key, nil
}

// Install copies the secret in from to to, for a process that cannot
// read from itself: a Kubernetes Secret volume's file is owned by root
// (or group-readable under fsGroup), so the chart's init container, as
// the sidecar's user, copies it into a volume of its own. from must be
// a regular file (a link to one is followed) holding a secret by the
// text rules above; its mode is not checked (only this step reads it).
// to is written whole, mode 0600, synced, then renamed into place,
// replacing an older copy.
func Install(from, to string) error {
	st, err := os.Stat(from)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%v)", from, st.Mode().Type())
	}
	f, err := os.Open(from)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	key := bytes.TrimSpace(b)
	switch {
	case len(b) > MaxBytes:
		return fmt.Errorf("%s holds more than %d bytes; a secret is %d to %d bytes of text", from, MaxBytes, MinBytes, MaxBytes)
	case len(key) < MinBytes:
		return fmt.Errorf("%s holds %d bytes of text; at least %d", from, len(key), MinBytes)
	}
	tmp, err := os.CreateTemp(filepath.Dir(to), "."+filepath.Base(to)+".new-*")
	if err != nil {
		return fmt.Errorf("installing %s: %w", to, err)
	}
	defer os.Remove(tmp.Name()) // gone once renamed, or on failure
	_, err = tmp.Write(append(key, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), to)
	}
	if err != nil {
		return fmt.Errorf("installing %s: %w", to, err)
	}
	return nil
}
