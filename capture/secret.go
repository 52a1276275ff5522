package capture

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// secretBytes is the size of a generated secret.
const secretBytes = 32

// LoadSecret returns the capture's secret from path, a file holding it
// in hex on one line, mode 0600 (or stricter): a file others may read is
// refused. When path does not exist, a new random secret is generated
// and written there, mode 0600, created exclusively (never over another
// file). The secret never goes into the trace.
func LoadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return newSecret(path)
	}
	if err != nil {
		return nil, fmt.Errorf("capture secret: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("capture secret: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("capture secret %s: mode %v lets others read it; want 0600", path, st.Mode().Perm())
	}
	key, err := hex.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(key) < secretBytes {
		return nil, fmt.Errorf("capture secret %s: want %d or more bytes in hex on one line", path, secretBytes)
	}
	return key, nil
}

func newSecret(path string) ([]byte, error) {
	key := make([]byte, secretBytes)
	rand.Read(key)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("capture secret: %w", err)
	}
	_, err = f.WriteString(hex.EncodeToString(key) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("capture secret: %w", err)
	}
	return key, nil
}
