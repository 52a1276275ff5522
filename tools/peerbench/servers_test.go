package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestToolCallFitsTheDeclaredSchema streams tool calls of 1 to 200
// events from the upstream and checks that the arguments, assembled from
// every delta, are the object the declared schema asks for, and that
// every event keeps its send stamp (the client's delay).
func TestToolCallFitsTheDeclaredSchema(t *testing.T) {
	var decl struct {
		Tools []struct {
			Function struct {
				Name       string `json:"name"`
				Parameters struct {
					Required   []string `json:"required"`
					Properties map[string]struct {
						Type    string `json:"type"`
						Minimum *int   `json:"minimum"`
						Maximum *int   `json:"maximum"`
					} `json:"properties"`
					AdditionalProperties *bool `json:"additionalProperties"`
				} `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	for _, body := range []string{string(toolBody), toolReady} {
		if err := json.Unmarshal([]byte(body), &decl); err != nil || len(decl.Tools) != 1 {
			t.Fatalf("a tool request's body: %v (%d tools)", err, len(decl.Tools))
		}
		fn := decl.Tools[0].Function
		if fn.Name != "get_weather" || strings.Join(fn.Parameters.Required, ",") != "city,days" ||
			fn.Parameters.AdditionalProperties == nil || *fn.Parameters.AdditionalProperties {
			t.Fatalf("declared tool %+v: want get_weather, city and days required, nothing else allowed", fn)
		}
	}
	u := &upstream{events: 200, interval: time.Microsecond, first: time.Microsecond}
	for _, n := range []int{1, 2, 3, 200} {
		body := bytes.Replace(toolBody, []byte(`"stream":true`), []byte(`"stream":true,"max_tokens":`+itoa(n)), 1)
		w := httptest.NewRecorder()
		u.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
		var args strings.Builder
		events, finish := 0, ""
		for line := range strings.SplitSeq(w.Body.String(), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ev struct {
				TS      int64 `json:"ts"`
				Choices []struct {
					Delta struct {
						ToolCalls []struct {
							Function struct {
								Name      string `json:"name"`
								Arguments string `json:"arguments"`
							} `json:"function"`
						} `json:"tool_calls"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("n=%d: event %q: %v", n, data, err)
			}
			if len(ev.Choices) == 0 {
				continue // the usage chunk
			}
			events++
			if ev.TS == 0 {
				t.Errorf("n=%d: event %d has no send stamp", n, events)
			}
			for _, c := range ev.Choices[0].Delta.ToolCalls {
				if events == 1 && c.Function.Name != "get_weather" {
					t.Errorf("n=%d: the first delta names %q", n, c.Function.Name)
				}
				args.WriteString(c.Function.Arguments)
			}
			if f := ev.Choices[0].FinishReason; f != nil {
				finish = *f
			}
		}
		if events != n || finish != "tool_calls" {
			t.Errorf("n=%d: %d events, finish %q; want %d and tool_calls", n, events, finish, n)
		}
		var got map[string]any
		dec := json.NewDecoder(strings.NewReader(args.String()))
		dec.UseNumber()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("n=%d: arguments %q: %v", n, args.String(), err)
		}
		city, _ := got["city"].(string)
		days, _ := got["days"].(json.Number)
		d, err := days.Int64()
		if len(got) != 2 || city == "" || err != nil || d < 1 || d > 14 {
			t.Errorf("n=%d: arguments %s do not fit the schema", n, args.String())
		}
	}
}
