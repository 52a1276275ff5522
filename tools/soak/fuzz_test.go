package main

import (
	"strings"
	"testing"
)

// FuzzParseMetrics: any text parses or is refused, never panics, and a
// parsed page's sums agree with its samples.
func FuzzParseMetrics(f *testing.F) {
	f.Add(exposition)
	f.Add("a 1\nb{x=\"}\"} 2 3\n# c\n\n")
	f.Add("x{\n")
	f.Add("x{} +Inf\n")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := parseMetrics(strings.NewReader(text))
		if err != nil {
			return
		}
		want := map[string]float64{}
		for _, s := range m {
			if s.name == "" || strings.ContainsAny(s.name, "{ \t") {
				t.Fatalf("sample name %q", s.name)
			}
			want[s.name] += s.value
		}
		for name, v := range want {
			if got := m.sum(name); got != v && !(got != got && v != v) {
				t.Fatalf("sum(%q) = %v, want %v", name, got, v)
			}
		}
	})
}

// FuzzReadSamples: any file reads or is refused, never panics; what it
// reads has finite numbers only, and summarizing and judging it works.
func FuzzReadSamples(f *testing.F) {
	h := strings.Join(sampleHeader, ",") + "\n"
	f.Add(h + "0,1,2,3,4,5,6\n10,1,2,3,4,5,7\n")
	f.Add(h + "1e308,1e308,-1e308,0,0,0,0\n")
	f.Add(h + "\"1\",2,3,4,5,6,7\n")
	f.Add("elapsed_s\n1\n")
	f.Fuzz(func(t *testing.T, text string) {
		s, err := readSamples(strings.NewReader(text))
		if err != nil {
			return
		}
		in := good()
		in.Samples = s
		judge(in, defaultLimits)
	})
}
