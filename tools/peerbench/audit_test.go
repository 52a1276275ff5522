package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuditFindsWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	live := func(tenant, structure string) string {
		s := `{"id":"x","traffic":"live","tenant":"` + tenant + `","api":"chat","usage_injected":true`
		if structure != "" {
			s += `,"structure":"` + structure + `"`
		}
		return s + "}\n"
	}
	canary := `{"id":"c","traffic":"canary","api":"chat"}` + "\n"
	records := write("r.jsonl", live("_none", "pass"), canary, live("t-0123456789ab", ""), live("t-0123456789ab", "pass"))
	good := write("c.jsonl", "{}\n", "{}\n", "{}\n")
	a := auditFiles("tokentap", 1, records, good)
	if a.records != 4 || a.live != 3 || a.captured != 3 || a.injected != 3 || a.structure["pass"] != 2 || a.tenants["t-0123456789ab"] != 2 {
		t.Fatalf("audit %s", a)
	}
	if p := a.problems(true); len(p) != 0 {
		t.Errorf("problems %q in a good pair of files", p)
	}

	short := write("short.jsonl", "{}\n", "{}\n")
	if p := auditFiles("tokentap", 1, records, short).problems(true); len(p) != 1 || !strings.Contains(p[0], "3 live records but 2 capture lines") {
		t.Errorf("a missing capture line: problems %q", p)
	}
	failed := write("failed.jsonl", live("t-0123456789ab", "fail"), live("t-0123456789ab", "pass"))
	if p := auditFiles("tokentap", 1, failed, short).problems(true); len(p) != 1 || !strings.Contains(p[0], "1 tool calls failed") {
		t.Errorf("a failed tool call: problems %q", p)
	}
	unchecked := write("unchecked.jsonl", live("_none", "unchecked"), live("_other", ""))
	p := auditFiles("tokentap", 1, unchecked, short).problems(true)
	if len(p) != 2 || !strings.Contains(p[0], "no tool call passed") || !strings.Contains(p[1], "no record has a tenant") {
		t.Errorf("no check passed, no tenant: problems %q", p)
	}
	if p := auditFiles("tokentap", 1, unchecked, short).problems(false); len(p) != 1 {
		t.Errorf("no keys sent: problems %q, want only the structure's", p)
	}
	if p := auditFiles("tokentap", 1, records, filepath.Join(dir, "absent")).problems(true); len(p) == 0 {
		t.Error("a capture file that is not there: no problem")
	}
	torn := write("torn.jsonl", live("_none", "pass"), `{"traffic":`)
	if a := auditFiles("tokentap", 1, torn, good); a.err == nil {
		t.Errorf("a torn record: no error (%s)", a)
	}
}
