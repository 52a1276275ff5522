package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/internal/usage"
)

const meta = `"api":"chat","stream":true,"outcome":"success","input_length_from":"engine","output_length_from":"engine","block_size":512`

// write puts each file's lines in dir and returns their paths.
func write(t *testing.T, dir string, files map[string]string) map[string]string {
	t.Helper()
	paths := map[string]string{}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths[name] = p
	}
	return paths
}

func run(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = Main(context.Background(), args, Env{Stdout: &o, Stderr: &e})
	return o.String(), e.String(), err
}

// The merge on scripted files: two fleet files (pod-a from 1,000,000 ms,
// pod-b from 1,000,010 ms) and one of per-file ids (aligned to the
// earliest start). Lines come out in arrival order, ties in argument
// order; fleet ids are one space (pod-b's first line shares pod-a's ids
// and session), the per-file ids another; timestamps count from the
// first line; each line keeps its replica.
func TestMergeScripted(t *testing.T) {
	const big = 900000000000000
	fleet := func(replica string, start, ts int64, session string, ids ...int64) string {
		var s []string
		for _, id := range ids {
			s = append(s, itoa(big+id))
		}
		sess := ""
		if session != "" {
			sess = `,"session_id":"` + session + `"`
		}
		return `{"timestamp":` + itoa(ts) + `,"input_length":1024,"output_length":5,"hash_ids":[` + strings.Join(s, ",") + `]` + sess +
			`,"tokentap":{"ids":"fleet","replica":"` + replica + `","start_unix_ms":` + itoa(start) + `,` + meta + "}}\n"
	}
	dir := t.TempDir()
	p := write(t, dir, map[string]string{
		"a.jsonl": fleet("pod-a", 1000000, 0, "77", 1, 2) + fleet("pod-a", 1000000, 30, "", 1, 3),
		"b.jsonl": fleet("pod-b", 1000010, 0, "77", 1, 2) + fleet("pod-b", 1000010, 20, "78", 3, 4),
		"c.jsonl": `{"timestamp":0,"input_length":1024,"output_length":3,"hash_ids":[0,1],"session_id":"77"}` + "\n" +
			`{"timestamp":15,"input_length":1024,"hash_ids":[0,2],"tokentap":{` + meta + `}}` + "\n",
	})
	out, stderr, err := run("merge", p["a.jsonl"], p["c.jsonl"], p["b.jsonl"])
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	c := p["c.jsonl"]
	want := `{"timestamp":0,"input_length":1024,"output_length":5,"hash_ids":[0,1],"session_id":"0","replica":"pod-a","tokentap":{` + meta + `}}
{"timestamp":0,"input_length":1024,"output_length":3,"hash_ids":[2,3],"session_id":"1","replica":"` + c + `"}
{"timestamp":10,"input_length":1024,"output_length":5,"hash_ids":[0,1],"session_id":"0","replica":"pod-b","tokentap":{` + meta + `}}
{"timestamp":15,"input_length":1024,"hash_ids":[2,4],"replica":"` + c + `","tokentap":{` + meta + `}}
{"timestamp":30,"input_length":1024,"output_length":5,"hash_ids":[0,5],"replica":"pod-a","tokentap":{` + meta + `}}
{"timestamp":30,"input_length":1024,"output_length":5,"hash_ids":[5,6],"session_id":"2","replica":"pod-b","tokentap":{` + meta + `}}
`
	if out != want {
		t.Errorf("merged:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(stderr, c+": hash ids numbered per file") || strings.Contains(stderr, "a.jsonl") {
		t.Errorf("stderr %q", stderr)
	}
	// A merged trace merges again (its replicas kept); -o writes a file.
	m := filepath.Join(dir, "m.jsonl")
	os.WriteFile(m, []byte(want), 0o644)
	o2 := filepath.Join(dir, "again.jsonl")
	if _, stderr, err := run("merge", m, "-o", o2); err != nil {
		t.Fatalf("%v %s", err, stderr)
	}
	if b, _ := os.ReadFile(o2); string(b) != want {
		t.Errorf("merged again:\n%s", b)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Bad input: the file and line named, exit 2; with -o nothing is left.
func TestMergeBadInput(t *testing.T) {
	dir := t.TempDir()
	good := `{"timestamp":0,"input_length":512,"hash_ids":[5],"tokentap":{"ids":"fleet","replica":"a","start_unix_ms":5,` + meta + "}}\n"
	for _, c := range []struct{ name, text, want string }{
		{"json", good + "{not json\n", "json.jsonl:2: not a JSON object"},
		{"decreasing", good + strings.Replace(good, `"start_unix_ms":5`, `"start_unix_ms":4`, 1), "decreasing.jsonl:2: arrival 4 ms"},
		{"nostart", good + strings.Replace(good, `"start_unix_ms":5,`, "", 1), "nostart.jsonl:2: fleet ids without start_unix_ms"},
		{"mixed", good + `{"timestamp":1,"input_length":512,"hash_ids":[5]}` + "\n", "mixed.jsonl:2: ids numbered per file in a file of fleet ids"},
		{"block", good + strings.Replace(good, `"block_size":512`, `"block_size":16`, 1), "block.jsonl:2: block_size 16, but "},
		{"idskind", strings.Replace(good, `"ids":"fleet"`, `"ids":"cluster"`, 1), `idskind.jsonl:1: tokentap.ids "cluster"`},
		{"negative", `{"timestamp":0,"input_length":512,"hash_ids":[-1]}` + "\n", "negative.jsonl:1: hash_ids: -1 is negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := write(t, dir, map[string]string{c.name + ".jsonl": c.text})
			out := filepath.Join(dir, c.name+".out")
			_, stderr, err := run("merge", "-o", out, p[c.name+".jsonl"])
			if usage.ExitCode(err) != 2 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q, want %q", usage.ExitCode(err), stderr, c.want)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("-o %s written after an error: %v", out, err)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "."+c.name+".out.merge-*")); len(m) > 0 {
				t.Errorf("temporary files left: %v", m)
			}
		})
	}
	for _, args := range [][]string{{"merge"}, {"merge", filepath.Join(dir, "missing.jsonl")}, {"merge", "--max-ids", "0", "x"}, {"frobnicate"}, {}} {
		if _, stderr, err := run(args...); usage.ExitCode(err) != 2 || stderr == "" {
			t.Errorf("%q: exit %d, stderr %q", args, usage.ExitCode(err), stderr)
		}
	}
}

// The renumbering tables are bounded: past MaxIDs a turn is counted, and
// an id forgotten and seen again gets a new number (sharing lost, never
// invented).
func TestMergeTableTurns(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, map[string]string{"t.jsonl": `{"timestamp":0,"input_length":1,"hash_ids":[10]}
{"timestamp":1,"input_length":1,"hash_ids":[11]}
{"timestamp":2,"input_length":1,"hash_ids":[12]}
{"timestamp":3,"input_length":1,"hash_ids":[13]}
{"timestamp":4,"input_length":1,"hash_ids":[10]}
`})
	var out bytes.Buffer
	var notes []string
	st, err := Merge(context.Background(), &out, []string{p["t.jsonl"]}, nil, MergeOptions{MaxIDs: 1, Note: func(s string) { notes = append(notes, s) }})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if st.Lines != 5 || st.Turns == 0 || len(notes) != 1 || !strings.Contains(lines[4], `"hash_ids":[4]`) {
		t.Errorf("stats %+v, notes %q, lines %q", st, notes, lines)
	}
}

// install-key copies the mounted secret into a 0600 file; a bad source
// exits 2.
func TestInstallKey(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "capture.key"), filepath.Join(dir, "copy.key")
	os.WriteFile(src, []byte(strings.Repeat("s", 64)+"\n"), 0o444)
	if _, stderr, err := run("install-key", "--from", src, "--to", dst); err != nil {
		t.Fatalf("%v %s", err, stderr)
	}
	if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("copy: %v %v", st, err)
	}
	if _, stderr, err := run("install-key", "--from", filepath.Join(dir, "none"), "--to", dst); usage.ExitCode(err) != 2 || !strings.Contains(stderr, "none") {
		t.Errorf("missing source: exit %d, %q", usage.ExitCode(err), stderr)
	}
}
