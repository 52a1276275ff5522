package stream

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

// jsonParts reads the members (keys decoded, values raw) or elements of
// the object or array in data with encoding/json.
func jsonParts(t *testing.T, data []byte) (keys []string, vals [][]byte) {
	dec := json.NewDecoder(bytes.NewReader(data))
	open, err := dec.Token()
	if err != nil {
		t.Fatalf("%q: %v", data, err)
	}
	for dec.More() {
		if open == json.Delim('{') {
			k, err := dec.Token()
			if err != nil {
				t.Fatalf("%q: %v", data, err)
			}
			keys = append(keys, k.(string))
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		vals = append(vals, v)
	}
	return keys, vals
}

// The scanner accepts every valid JSON document (within its depth bound)
// and reads the same members and elements as encoding/json; intVal and
// strVal read only what encoding/json reads as an integer or a string.
func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, ` {"a" : [1, 2.5e3, "x\"y"], "b": {"c": null}} `, `[true,false,null,-0,"\u00e9"]`,
		`{"a":1,"a":2}`, `{"k\"ey":"v"}`, `[[[[]]]]`, `{"a":}`, `[1,]`, `{"a" 1}`, `"str"`, `123`, `-`, `{"a":[}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		end := skipValue(data, 0)
		if end < -1 || end > len(data) {
			t.Fatalf("%q: skipValue = %d", data, end)
		}
		for _, v := range [][]byte{data, trimWS(data)} {
			if n, ok := intVal(v); ok {
				if m, err := strconv.ParseInt(string(v), 10, 64); err != nil || m != n {
					t.Fatalf("intVal(%q) = %d, strconv says %d, %v", v, n, m, err)
				}
			}
		}
		if !json.Valid(data) || bytes.Count(data, []byte("{"))+bytes.Count(data, []byte("[")) > maxDepth {
			return
		}
		if end < 0 || skipWS(data, end) != len(data) || (end > 0 && isWS(data[end-1])) {
			t.Fatalf("%q: valid JSON, skipValue = %d of %d", data, end, len(data))
		}
		d := trimWS(data)
		var gotKeys []string
		var gotVals [][]byte
		var ok bool
		switch d[0] {
		case '{':
			ok = eachMember(data, func(k, v []byte) bool {
				var key string
				if err := json.Unmarshal(append(append([]byte{'"'}, k...), '"'), &key); err != nil {
					t.Fatalf("%q: key %q: %v", data, k, err)
				}
				gotKeys, gotVals = append(gotKeys, key), append(gotVals, v)
				return true
			})
		case '[':
			ok = eachElement(data, func(v []byte) bool {
				gotVals = append(gotVals, v)
				return true
			})
			if n := countElements(data); n != len(gotVals) {
				t.Fatalf("%q: countElements = %d, eachElement saw %d", data, n, len(gotVals))
			}
		default:
			if eachMember(data, func(k, v []byte) bool { return true }) || eachElement(data, func([]byte) bool { return true }) {
				t.Fatalf("%q: a scalar read as an object or array", data)
			}
			return
		}
		if !ok {
			t.Fatalf("%q: valid JSON, the scanner says malformed", data)
		}
		keys, vals := jsonParts(t, data)
		if len(gotKeys) != len(keys) || len(gotVals) != len(vals) {
			t.Fatalf("%q: scanner read keys %q values %q; encoding/json %q %q", data, gotKeys, gotVals, keys, vals)
		}
		for i := range keys {
			if gotKeys[i] != keys[i] {
				t.Fatalf("%q: key %d is %q, encoding/json says %q", data, i, gotKeys[i], keys[i])
			}
		}
		for i, v := range vals {
			if !bytes.Equal(gotVals[i], v) {
				t.Fatalf("%q: value %d is %q, encoding/json says %q", data, i, gotVals[i], v)
			}
			if s, ok := strVal(v); ok {
				var str string
				if json.Unmarshal(v, &str) != nil {
					t.Fatalf("strVal(%q) = %q, but it is no JSON string", v, s)
				}
			}
			if _, ok := intVal(v); ok {
				var n int64
				if json.Unmarshal(v, &n) != nil {
					t.Fatalf("intVal(%q) ok, but encoding/json reads no int64", v)
				}
			}
		}
	})
}

func TestMemberSpan(t *testing.T) {
	cases := []struct{ in, key, want string }{
		{`{"id":"x","choices":[],"usage":{"prompt_tokens":0}}`, "usage", `{"id":"x","choices":[]}`},
		{`{"usage":{"a":1},"id":"x"}`, "usage", `{"id":"x"}`},
		{`{"usage":null}`, "usage", `{}`},
		{`{ "a" : 1 , "usage" : { } , "b" : [ ] }`, "usage", `{ "a" : 1 , "b" : [ ] }`},
		{`{"a":{"usage":1},"b":2}`, "usage", ""},
		{`{"a":"usage"}`, "usage", ""},
		{`{"a":1,"usage":{}`, "usage", ""},
		{`[1]`, "usage", ""},
	}
	for _, c := range cases {
		s, e, ok := MemberSpan([]byte(c.in), c.key)
		got := ""
		if ok {
			got = c.in[:s] + c.in[e:]
		}
		if got != c.want {
			t.Errorf("%s without %s: %q, want %q", c.in, c.key, got, c.want)
		}
		if ok && !json.Valid([]byte(got)) {
			t.Errorf("%s: result %q is not JSON", c.in, got)
		}
	}
}

func FuzzMemberSpan(f *testing.F) {
	for _, s := range []string{`{"a":1,"usage":{"b":2}}`, `{"usage":1}`, `{"usage":1,"c":[1,{"usage":2}]}`, `{ "x" : "usage" }`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s, e, ok := MemberSpan(in, "usage")
		if !ok {
			return
		}
		out := append(append([]byte(nil), in[:s]...), in[e:]...)
		var before, after map[string]json.RawMessage
		if json.Unmarshal(in, &before) != nil || bytes.Contains(in, []byte(`\`)) || bytes.Count(in, []byte(`"usage"`)) > 1 {
			return // the scanner does not check strings and numbers, nor unescape keys
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("%q without usage: %q is not an object: %v", in, out, err)
		}
		if _, still := after["usage"]; still {
			t.Fatalf("%q: %q still has usage", in, out)
		}
		delete(before, "usage")
		if len(before) != len(after) {
			t.Fatalf("%q: members %v, after removal %v", in, before, after)
		}
	})
}
