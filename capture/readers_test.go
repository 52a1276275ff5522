package capture_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readers implement, line by line, the checks that each load generator's
// Mooncake reader applies to a trace, from the source named with each;
// TestCaptureScriptedWorkload runs them over its capture, and
// TestReaderRulesRefuse shows that each refuses what its reader refuses.
var readers = []struct {
	name  string
	check func(t *testing.T, path string)
}{
	{"AIPerf", func(t *testing.T, path string) { report(t, aiperfCheck(path, 512)) }},
	{"GuideLLM", func(t *testing.T, path string) { report(t, guidellmCheck(path, 512)) }},
	{"SGLang", func(t *testing.T, path string) { report(t, sglangCheck(path)) }},
	{"vLLM", func(t *testing.T, path string) { report(t, vllmCheck(path, 512)) }},
}

func report(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if i == 10 {
			t.Errorf("... %d more", len(errs)-10)
			break
		}
		t.Error(err)
	}
}

// lines returns the trace's lines that are not blank after stripping
// (every reader below skips those), with their 1-based numbers.
func lines(path string) ([][]byte, []int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var out [][]byte
	var nums []int
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<24)
	for n := 1; sc.Scan(); n++ {
		if l := bytes.TrimSpace(sc.Bytes()); len(l) > 0 {
			out = append(out, append([]byte(nil), l...))
			nums = append(nums, n)
		}
	}
	return out, nums, sc.Err()
}

// object decodes a line into its members, numbers kept as written.
func object(l []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(l))
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return m, nil
}

// jsonInt reports whether raw is a JSON integer (pydantic's int in JSON
// mode: a number without fraction or exponent; null handled by callers).
func jsonInt(raw json.RawMessage) (int64, bool) {
	if v := bytes.TrimSpace(raw); len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	v, err := n.Int64()
	return v, err == nil
}

func present(m map[string]json.RawMessage, k string) bool {
	v, ok := m[k]
	return ok && string(v) != "null"
}

// aiperfCheck: AIPerf's mooncake_trace loader, ai-dynamo/aiperf at
// db4f6397d11ee2d4cfbb41f70b2327315163dcf0 (version 0.1.1):
//   - aiperf/dataset/loader/mooncake_trace.py, load_dataset: each line,
//     stripped, non-blank, is MooncakeTrace.model_validate_json(line);
//   - aiperf/dataset/loader/models.py, MooncakeTrace: input_length,
//     output_length, timestamp, delay: int | None; text_input,
//     session_id: str | None; hash_ids: list[int] | None; validate_input:
//     input_length or text_input given, and input_length given when
//     hash_ids is; aiperf/common/models/base_models.py, AIPerfBaseModel:
//     extra="allow" (other keys are kept, not refused);
//   - aiperf/dataset/generator/prompt.py, _generate_cached_prompt (when
//     hash_ids is not empty): the last block's size, input_length −
//     (len(hash_ids) − 1) × block_size, is above 0 and at most block_size
//     (--isl-block-size, 512).
func aiperfCheck(path string, block int64) []error {
	ls, nums, err := lines(path)
	if err != nil {
		return []error{err}
	}
	var errs []error
	bad := func(i int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("aiperf: line %d: %s", nums[i], fmt.Sprintf(format, a...)))
	}
	for i, l := range ls {
		m, err := object(l)
		if err != nil {
			bad(i, "not a JSON object: %v", err)
			continue
		}
		for _, k := range []string{"input_length", "output_length", "timestamp", "delay"} {
			if present(m, k) {
				if _, ok := jsonInt(m[k]); !ok {
					bad(i, "%s %s is not an int", k, m[k])
				}
			}
		}
		for _, k := range []string{"text_input", "session_id"} {
			var s string
			if present(m, k) && json.Unmarshal(m[k], &s) != nil {
				bad(i, "%s %s is not a string", k, m[k])
			}
		}
		var ids []json.RawMessage
		if present(m, "hash_ids") {
			if json.Unmarshal(m["hash_ids"], &ids) != nil {
				bad(i, "hash_ids is not a list")
			}
			for _, id := range ids {
				if _, ok := jsonInt(id); !ok {
					bad(i, "hash id %s is not an int", id)
				}
			}
		}
		if !present(m, "input_length") && !present(m, "text_input") {
			bad(i, "neither input_length nor text_input")
		}
		if !present(m, "input_length") && present(m, "hash_ids") {
			bad(i, "hash_ids without input_length")
		}
		if n, _ := jsonInt(m["input_length"]); len(ids) > 0 {
			last := n - int64(len(ids)-1)*block
			if last <= 0 || last > block {
				bad(i, "input_length %d and %d hash ids: the last block would hold %d tokens", n, len(ids), last)
			}
		}
	}
	return errs
}

// guidellmCheck: GuideLLM's Mooncake reader, vllm-project/guidellm at
// ee7a77457ba668b4b5ccb40f110518829893b36a (after v0.7.3):
//   - src/guidellm/utils/hf_datasets.py, load_dataset_from_file: the
//     suffix is .json, .jsonl, .csv or .parquet, read by Hugging Face
//     datasets' json builder, which infers one type per column from the
//     lines (so a key keeps one JSON type on every line);
//   - src/guidellm/data/deserializers/trace_common.py, validate_path (a
//     non-empty file), try_load_trace and _load_trace_rows: the columns
//     timestamp (float), input_length and output_length (int32) have no
//     null, and cast; _validate_row: both counts are 0 or more;
//   - src/guidellm/data/deserializers/trace_mooncake.py:
//     required_columns hash_ids: List(int32); validate_row: every id is
//     0 or more, and ceil(input_length / hash_id_block_size) ==
//     len(hash_ids), hash_id_block_size 512 by default.
func guidellmCheck(path string, block int64) []error {
	var errs []error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json", ".jsonl", ".csv", ".parquet":
	default:
		errs = append(errs, fmt.Errorf("guidellm: suffix %q is not one it reads", filepath.Ext(path)))
	}
	ls, nums, err := lines(path)
	if err != nil {
		return append(errs, err)
	}
	if len(ls) == 0 {
		return append(errs, fmt.Errorf("guidellm: empty trace"))
	}
	bad := func(i int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("guidellm: line %d: %s", nums[i], fmt.Sprintf(format, a...)))
	}
	kinds := map[string]byte{} // the first JSON type of each key, nested ones by path
	var kindOf func(prefix string, raw json.RawMessage, i int)
	kindOf = func(prefix string, raw json.RawMessage, i int) {
		v := bytes.TrimSpace(raw)
		if len(v) == 0 || string(v) == "null" {
			return
		}
		k := v[0]
		if k == 't' || k == 'f' {
			k = 'b'
		}
		if k == '-' || (k >= '0' && k <= '9') {
			k = 'n'
		}
		if prev, ok := kinds[prefix]; ok && prev != k {
			bad(i, "%s changes JSON type (%c after %c): one column type per key", prefix, k, prev)
		}
		kinds[prefix] = k
		if k == '{' {
			var m map[string]json.RawMessage
			json.Unmarshal(v, &m)
			for key, sub := range m {
				kindOf(prefix+"."+key, sub, i)
			}
		}
	}
	for i, l := range ls {
		m, err := object(l)
		if err != nil {
			bad(i, "not a JSON object: %v", err)
			continue
		}
		for key, v := range m {
			kindOf(key, v, i)
		}
		var ts float64
		if !present(m, "timestamp") || json.Unmarshal(m["timestamp"], &ts) != nil {
			bad(i, "timestamp missing or not a number")
		}
		counts := map[string]int64{}
		for _, k := range []string{"input_length", "output_length"} {
			n, ok := jsonInt(m[k])
			if !present(m, k) || !ok || n > math.MaxInt32 || n < math.MinInt32 {
				bad(i, "%s missing or not an int32", k)
			}
			if n < 0 {
				bad(i, "%s %d is negative", k, n)
			}
			counts[k] = n
		}
		var ids []int64
		if !present(m, "hash_ids") || json.Unmarshal(m["hash_ids"], &ids) != nil {
			bad(i, "hash_ids missing or not a list of ints")
		}
		for _, id := range ids {
			if id < 0 || id > math.MaxInt32 {
				bad(i, "hash id %d is not a non-negative int32", id)
			}
		}
		if want := (counts["input_length"] + block - 1) / block; int64(len(ids)) != want {
			bad(i, "input_length %d in blocks of %d is %d blocks, not the %d hash ids", counts["input_length"], block, want, len(ids))
		}
	}
	return errs
}

// sglangCheck: SGLang's bench_serving Mooncake reader, sgl-project/sglang
// at 17481b4e6a151e7283edf0cb4952166710b04ab4,
// python/sglang/benchmark/datasets/mooncake.py: MooncakeDataset.load
// reads json.loads(line) of every non-blank line;
// get_mooncake_request_over_time sorts by record["timestamp"] (required,
// a number: it is subtracted and divided by 1000), formats each of
// record.get("hash_ids", []) into the prompt, and multiplies a list by
// record.get("output_length", 256) (an int).
func sglangCheck(path string) []error {
	ls, nums, err := lines(path)
	if err != nil {
		return []error{err}
	}
	var errs []error
	bad := func(i int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("sglang: line %d: %s", nums[i], fmt.Sprintf(format, a...)))
	}
	for i, l := range ls {
		m, err := object(l)
		if err != nil {
			bad(i, "json.loads: %v", err)
			continue
		}
		var ts float64
		if json.Unmarshal(m["timestamp"], &ts) != nil || !present(m, "timestamp") {
			bad(i, "record[\"timestamp\"] missing or not a number")
		}
		if present(m, "hash_ids") {
			var ids []json.RawMessage
			if json.Unmarshal(m["hash_ids"], &ids) != nil {
				bad(i, "hash_ids is not a list")
			}
		}
		if present(m, "output_length") {
			if _, ok := jsonInt(m["output_length"]); !ok {
				bad(i, "output_length is not an int")
			}
		}
	}
	return errs
}

// vllmCheck: vLLM's timed_trace reader (vllm bench serve --dataset-name
// timed_trace), vllm-project/vllm at
// bfb9ebc211d3b4abaa3fc2c87315ff7801d93d5b (PR #39795's merge) and
// unchanged in these rules at 93e3bc8f30b1e135b88a2ffc7f219e3428d39293
// (main, 2026-07-13), vllm/benchmarks/datasets/datasets.py, TimedTrace:
// the file's readlines(), each json.loads(line.strip()) (so a blank line
// is an error, unlike the other readers); timestamp, input_length and
// output_length required and not null (ValueError), timestamp through
// float(), input_length compared and subtracted (a number); hash_ids
// optional. Two rules are the replay's fidelity rather than refusals,
// and checked as errors all the same, since a file that breaks them
// replays another workload without a word: _expand_prompt builds
// min(input_length, len(hash_ids) × chunk) tokens, so the ids must
// cover input_length at --timed-trace-chunk-hash-size chunk; and
// vllm/benchmarks/serve.py, get_request, sends in file order, each line
// at its timestamp from the start or at once when that is past, so the
// timestamps must not decrease.
func vllmCheck(path string, chunk int64) []error {
	b, err := os.ReadFile(path)
	if err != nil {
		return []error{err}
	}
	var errs []error
	bad := func(n int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("vllm: line %d: %s", n, fmt.Sprintf(format, a...)))
	}
	prev := math.Inf(-1)
	for n, l := range strings.SplitAfter(string(b), "\n") {
		if l == "" {
			break // the end of a file whose last line ends in a newline
		}
		m, err := object([]byte(strings.TrimSpace(l)))
		if err != nil {
			bad(n+1, "json.loads: %v", err)
			continue
		}
		for _, k := range []string{"timestamp", "input_length", "output_length"} {
			if !present(m, k) {
				bad(n+1, "%s missing or null: ValueError", k)
			}
		}
		var ts, in float64
		if json.Unmarshal(m["timestamp"], &ts) == nil && present(m, "timestamp") {
			if ts < prev {
				bad(n+1, "timestamp %v after %v: sent in file order, not at its instant", ts, prev)
			}
			prev = ts
		} else if present(m, "timestamp") {
			bad(n+1, "float(timestamp) fails")
		}
		if present(m, "input_length") && json.Unmarshal(m["input_length"], &in) != nil {
			bad(n+1, "input_length is not a number")
		}
		var ids []json.RawMessage
		if present(m, "hash_ids") && json.Unmarshal(m["hash_ids"], &ids) != nil {
			bad(n+1, "hash_ids is not a list")
		}
		if float64(int64(len(ids))*chunk) < in {
			bad(n+1, "%d hash_ids of %d tokens build %d of input_length %v tokens", len(ids), chunk, int64(len(ids))*chunk, in)
		}
	}
	return errs
}

// TestReaderRulesRefuse: each reader's checks refuse the lines its
// reader refuses, so that passing them means something.
func TestReaderRulesRefuse(t *testing.T) {
	cases := []struct {
		line string
		bad  map[string]bool // readers that refuse it
	}{
		{`{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[0,1]}`, nil},
		{`{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[0]}`, map[string]bool{"AIPerf": true, "GuideLLM": true, "vLLM": true}},
		{`{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[0,-1]}`, map[string]bool{"GuideLLM": true}},
		{`{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[0,1],"session_id":7}`, map[string]bool{"AIPerf": true}},
		{`{"input_length":600,"output_length":5,"hash_ids":[0,1]}`, map[string]bool{"GuideLLM": true, "SGLang": true, "vLLM": true}},
		{`{"timestamp":0,"output_length":5}`, map[string]bool{"AIPerf": true, "GuideLLM": true, "vLLM": true}},
		{"{\"timestamp\":0,\"input_length\":600,\"output_length\":5,\"hash_ids\":[0,1]}\n\n{\"timestamp\":1,\"input_length\":600,\"output_length\":5,\"hash_ids\":[0,1]}", map[string]bool{"vLLM": true}},
		{"{\"timestamp\":5,\"input_length\":600,\"output_length\":5,\"hash_ids\":[0,1]}\n{\"timestamp\":1,\"input_length\":600,\"output_length\":5,\"hash_ids\":[0,1]}", map[string]bool{"vLLM": true}},
		{`{"timestamp":1.5,"input_length":600,"output_length":5,"hash_ids":[0,1]}`, map[string]bool{"AIPerf": true}},
		{`{"timestamp":0,"input_length":600,"output_length":5.5,"hash_ids":[0,1]}`, map[string]bool{"AIPerf": true, "GuideLLM": true, "SGLang": true}},
	}
	for _, c := range cases {
		path := filepath.Join(t.TempDir(), "t.jsonl")
		if err := os.WriteFile(path, []byte(c.line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for name, errs := range map[string][]error{"AIPerf": aiperfCheck(path, 512), "GuideLLM": guidellmCheck(path, 512), "SGLang": sglangCheck(path), "vLLM": vllmCheck(path, 512)} {
			if got := len(errs) > 0; got != c.bad[name] {
				t.Errorf("%s on %s: refused %v (%v), want %v", name, c.line, got, errs, c.bad[name])
			}
		}
	}
}
