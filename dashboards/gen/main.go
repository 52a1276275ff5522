// Command gen writes the Grafana dashboards defined in package dashboards
// as JSON into dashboards/ (the Helm chart's ConfigMaps read them through
// the link deploy/helm/tokentap/dashboards). Run it from the repository
// root after changing a dashboard:
//
//	go run ./dashboards/gen
//
// dashboards' tests fail when a file differs from what this writes.
package main

import (
	"fmt"
	"os"

	"github.com/tokentap/tokentap/dashboards"
)

func main() {
	files, err := dashboards.Generated(".")
	if err == nil {
		for path, b := range files {
			if err = os.WriteFile(path, b, 0o644); err != nil {
				break
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
		os.Exit(1)
	}
}
