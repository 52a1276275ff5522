package capture

import (
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// Canonical is the canonical prompt by API name (the simulator's prefix
// cache cuts the same bytes): the API's prompt members, none for an API
// the capture does not read or an unknown name.
func TestCanonicalByAPI(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"p q","messages":[ {"role":"user", "content":"hi"} ]}`)
	for _, c := range []struct {
		api  stream.Name
		want string
		n    int
	}{
		{stream.NameChat, "messages\x00[{\"role\":\"user\",\"content\":\"hi\"}]\x00", 1},
		{stream.NameCompletions, "prompt\x00\"p q\"\x00", 1},
		{"no-such-api", "", 0},
	} {
		var got []byte
		n := Canonical(body, c.api, func(p []byte) { got = append(got, p...) })
		if string(got) != c.want || n != c.n {
			t.Errorf("%s: %q (%d), want %q (%d)", c.api, got, n, c.want, c.n)
		}
	}
}
