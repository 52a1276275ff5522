package config

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func noEnv(string) string { return "" }

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestValidFile(t *testing.T) {
	c, err := Load([]string{"--config", "testdata/valid.yaml"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream != "http://127.0.0.1:8000" || c.InjectUsage || c.MaxModels != 5 || c.Timeout != 2*time.Minute ||
		c.Simulator.MaxBatch != 4 || c.Simulator.DecodeBase != 20*time.Millisecond || c.Simulator.MaxQueue != 32 {
		t.Fatalf("loaded %+v", c)
	}
}

// Each invalid file fails with exactly these problems, named.
func TestInvalidFiles(t *testing.T) {
	cases := map[string][]string{
		"invalid-unknown-field.yaml":   {"config file testdata/invalid-unknown-field.yaml: yaml: unmarshal errors:\n  line 2: field listne not found in type config.Config"},
		"invalid-upstream-scheme.yaml": {`upstream: scheme must be http or https, got "ftp"`},
		"invalid-sim-prob.yaml":        {"simulator.error_prob must be in [0,1]"},
		"invalid-type.yaml":            {"config file testdata/invalid-type.yaml: yaml: unmarshal errors:\n  line 1: cannot unmarshal !!str `many` into int"},
		"invalid-many.yaml": {
			`upstream: "http://" has no host`,
			`listen: "8080" is not host:port: address 8080: missing port in address`,
			"max_models: must be at least 1, got 0",
			`log_level: must be debug, info, warn or error, got "loud"`,
			"simulator.jitter must be in [0,1]",
			"simulator.reject_status must be a 4xx or 5xx status",
		},
	}
	for file, want := range cases {
		t.Run(file, func(t *testing.T) {
			_, err := Load([]string{"--config", "testdata/" + file}, noEnv, io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			if got := err.Error(); got != strings.Join(want, "\n") {
				t.Fatalf("errors:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
			}
		})
	}
}

func TestPrecedenceFlagsOverEnvOverFile(t *testing.T) {
	env := envOf(map[string]string{
		"TOKENTAP_ADMIN_LISTEN":  "127.0.0.1:7001",
		"TOKENTAP_LISTEN":        "127.0.0.1:7002",
		"TOKENTAP_SIM_MAX_BATCH": "9",
		"TOKENTAP_INJECT_USAGE":  "true",
	})
	c, err := Load([]string{"--config=testdata/valid.yaml", "--listen", "127.0.0.1:7003"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:7003" {
		t.Errorf("listen %q: the flag must win over env and file", c.Listen)
	}
	if c.AdminListen != "127.0.0.1:7001" || c.Simulator.MaxBatch != 9 || !c.InjectUsage {
		t.Errorf("env must win over the file: %+v", c)
	}
	if c.Upstream != "http://127.0.0.1:8000" {
		t.Errorf("file value lost: %q", c.Upstream)
	}
}

func TestConfigFromEnv(t *testing.T) {
	c, err := Load(nil, envOf(map[string]string{"TOKENTAP_CONFIG": "testdata/valid.yaml"}), io.Discard)
	if err != nil || c.File != "testdata/valid.yaml" || c.MaxModels != 5 {
		t.Fatalf("TOKENTAP_CONFIG not honoured: %v %+v", err, c)
	}
}

func TestBadFlagsAndEnvAllNamed(t *testing.T) {
	_, err := Load([]string{"--max-models", "x"}, envOf(map[string]string{"TOKENTAP_TIMEOUT": "soon"}), io.Discard)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`invalid value "x" for flag -max-models`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	_, err = Load(nil, envOf(map[string]string{"TOKENTAP_TIMEOUT": "soon", "TOKENTAP_SIM_JITTER": "lots"}), io.Discard)
	for _, want := range []string{"TOKENTAP_TIMEOUT: parse error", "TOKENTAP_SIM_JITTER: parse error"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
}

func TestHelp(t *testing.T) {
	var sb strings.Builder
	_, err := Load([]string{"-h"}, noEnv, &sb)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(sb.String(), "TOKENTAP_<FLAG>") || !strings.Contains(sb.String(), "-sim.max-batch") {
		t.Fatalf("help: %v\n%s", err, sb.String())
	}
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{"admin-listen": "TOKENTAP_ADMIN_LISTEN", "sim.max-batch": "TOKENTAP_SIM_MAX_BATCH", "upstream": "TOKENTAP_UPSTREAM"} {
		if got := EnvName(in); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", in, got, want)
		}
	}
}
