package capture

import (
	"fmt"

	"github.com/tokentap/tokentap/internal/secret"
)

// LoadSecret returns the capture's secret from path, creating it when
// path does not exist, by the rules of package internal/secret (the
// file's text, at least 32 bytes, a regular file only its owner may
// read; created atomically, never over another file). The secret never
// goes into the trace.
func LoadSecret(path string) ([]byte, error) {
	k, err := secret.Load(path)
	if err != nil {
		return nil, fmt.Errorf("capture secret: %w", err)
	}
	return k, nil
}
