// Command rulegen writes the Prometheus recording and alerting rules that
// ship in deploy/, from slo/rules.go: a plain rules file and a
// PrometheusRule manifest. Run it from the repository root:
//
//	go run ./deploy/rulegen
package main

import (
	"fmt"
	"os"

	"github.com/tokentap/tokentap/slo"
)

func main() {
	plain, err := slo.PlainRules(slo.RuleParams{})
	if err == nil {
		err = os.WriteFile("deploy/prometheus/tokentap-rules.yaml", plain, 0o644)
	}
	var manifest []byte
	if err == nil {
		manifest, err = slo.PrometheusRuleManifest(slo.RuleParams{})
	}
	if err == nil {
		err = os.WriteFile("deploy/kubernetes/prometheusrule.yaml", manifest, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rulegen:", err)
		os.Exit(1)
	}
}
