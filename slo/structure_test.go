package slo

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// withStructure is r with the structure check's result.
func withStructure(r *record.Record, status string, failed ...string) *record.Record {
	r.Structure, r.StructureFailed = status, failed
	if status == "unchecked" {
		r.StructureUnchecked = "request_partial"
	}
	return r
}

// Under structure: required a failed check fails the request by name,
// next to any threshold; an unchecked answer lists "structure" as not
// applicable; without it the check is not read. FastInvalid holds only
// for a failure on structure checks alone.
func TestVerdictStructure(t *testing.T) {
	req := objective()
	req.Structure = config.StructureRequired
	slow := func() *record.Record { return rec(record.Success, 5, 501, 540, 580, 620, 660) } // TTFT 501 > 500
	for _, c := range []struct {
		name        string
		o           Objective
		r           *record.Record
		failed, na  []string
		fastInvalid bool
	}{
		{"pass", req, withStructure(good(), "pass"), nil, nil, false},
		{"fail", req, withStructure(good(), "fail", "tool_args_schema"), []string{"tool_args_schema"}, nil, true},
		{"two checks", req, withStructure(good(), "fail", "tool_args_invalid_json", "unknown_tool"), []string{"tool_args_invalid_json", "unknown_tool"}, nil, true},
		{"too large", req, withStructure(good(), "fail", "too_large"), []string{"too_large"}, nil, true},
		{"slow and invalid", req, withStructure(slow(), "fail", "output_schema"), []string{TTFT, "output_schema"}, nil, false},
		{"unchecked", req, withStructure(good(), "unchecked"), nil, []string{Structure}, false},
		{"not required", objective(), withStructure(good(), "fail", "tool_args_schema"), nil, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.Thresholds.Fluidity = 0
			v := judge(c.o, c.r)
			if v.Qualified != (len(c.failed) == 0) || !reflect.DeepEqual(v.Failed, c.failed) || !reflect.DeepEqual(v.NotApplicable, c.na) || FastInvalid(&v) != c.fastInvalid {
				t.Fatalf("%+v (fast invalid %v), want failed %v not applicable %v fast invalid %v", v, FastInvalid(&v), c.failed, c.na, c.fastInvalid)
			}
		})
	}
}

// /slo shows the share of fast but invalid answers: of 4 offered
// requests, one on time with a failed check (fast but invalid), one slow
// with a failed check (not fast), one error, one good: 1 (25%).
func TestPageFastInvalidShare(t *testing.T) {
	o := objective()
	o.Structure, o.Thresholds.Fluidity = config.StructureRequired, 0
	cfg := Config{Objectives: []Objective{o}}
	book := NewBook(cfg, nil)
	now := time.Unix(2000, 0)
	book.clock = func() time.Time { return now }
	j := NewJudge(cfg)
	for _, r := range []*record.Record{
		withStructure(good(), "fail", "tool_args_schema"),
		withStructure(rec(record.Success, 5, 501, 540, 580, 620, 660), "fail", "tool_args_schema"),
		rec(record.Error, 0),
		withStructure(good(), "pass"),
	} {
		judged(j, r)
		book.Add(r)
	}
	w := httptest.NewRecorder()
	book.ServeHTTP(w, httptest.NewRequest("GET", "/slo?format=json", nil))
	var page struct {
		SLOs []struct {
			Offered     int64    `json:"offered"`
			FastInvalid int64    `json:"fast_invalid"`
			Share       *float64 `json:"fast_invalid_share"`
		} `json:"slos"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || len(page.SLOs) != 1 {
		t.Fatalf("%v: %s", err, w.Body)
	}
	if s := page.SLOs[0]; s.Offered != 4 || s.FastInvalid != 1 || s.Share == nil || *s.Share != 0.25 {
		t.Fatalf("offered %d, fast invalid %d, share %v; want 4, 1, 0.25", s.Offered, s.FastInvalid, s.Share)
	}
	w = httptest.NewRecorder()
	book.ServeHTTP(w, httptest.NewRequest("GET", "/slo", nil))
	if body := w.Body.String(); !strings.Contains(body, "<th>fast but invalid</th>") || !strings.Contains(body, "<td>1 (25%)</td>") {
		t.Fatalf("the HTML page lacks the fast-but-invalid column or its 1 (25%%):\n%s", body)
	}
}
