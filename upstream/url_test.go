package upstream

import (
	"net/url"
	"testing"
)

// An engine behind a path prefix is asked under it, with or without the
// base URL's trailing slash; its credentials stay off the URL.
func TestURLJoinsUnderTheBasePath(t *testing.T) {
	for _, c := range []struct{ base, path, want string }{
		{"http://engine:8000", "/v1/models", "http://engine:8000/v1/models"},
		{"http://engine:8000", "/", "http://engine:8000/"},
		{"http://user:pw@engine:8000/vllm/", "/health", "http://engine:8000/vllm/health"},
		{"http://engine:8000/vllm", "/", "http://engine:8000/vllm/"},
		{"https://engine/a%2Fb/", "/v1/models", "https://engine/a%2Fb/v1/models"},
	} {
		base, err := url.Parse(c.base)
		if err != nil {
			t.Fatal(err)
		}
		if got := New(Options{URL: base}).url(c.path); got != c.want {
			t.Errorf("%s + %s = %s, want %s", c.base, c.path, got, c.want)
		}
	}
}
