package stream

import (
	"strings"
	"testing"
)

func TestTopMembers(t *testing.T) {
	cases := []struct {
		in   string
		want string // key=value pairs seen, in order
		end  int
	}{
		{`{"a":1,"b":{"c":[1,2]},"d":"x"}`, `a=1 b={"c":[1,2]} d="x"`, 31},
		{` {"a":1} junk`, `a=1`, 8},
		{`{"a":"x","b":12`, `a="x"`, -1},  // a number cut by the end is not complete
		{`{"a":"x","b":"yy`, `a="x"`, -1}, // nor a string
		{`{"a":"x","b":[1,{"c":2}],"c`, `a="x" b=[1,{"c":2}]`, -1},
		{`{"a":"x" "b":1}`, `a="x"`, -1}, // malformed after a
		{`[1]`, ``, -1},
		{``, ``, -1},
		{`{}`, ``, 2},
	}
	for _, c := range cases {
		var got []string
		end := TopMembers([]byte(c.in), func(k []byte, s, e int) {
			got = append(got, string(k)+"="+c.in[s:e])
		})
		if g := strings.Join(got, " "); g != c.want || end != c.end {
			t.Errorf("%q: members %q end %d, want %q %d", c.in, g, end, c.want, c.end)
		}
	}
}

func TestTopMembersAllocatesNothing(t *testing.T) {
	b := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 1<<16) + `"}],"stream":true}`)
	n := 0
	if a := testing.AllocsPerRun(10, func() { TopMembers(b, func([]byte, int, int) { n++ }) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}
