// Package deploycheck holds the checks of tokentap's deployment kit: the
// Kubernetes manifests in deploy/kubernetes, the Helm chart in
// deploy/helm/tokentap, the docker compose example in deploy/compose, and
// the container image built from the Dockerfile. It is a module of its own
// so that k8s.io/api, the prometheus-operator types and compose-go never
// enter the sidecar's module. Run its tests from this folder:
//
//	go test ./...
//
// (scripts/test.sh does, after installing helm and buildah).
package deploycheck

import (
	"bytes"
	"fmt"
	"regexp"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Kinds are the object kinds the kit ships, with the Go type each decodes
// into: Kubernetes' own (k8s.io/api) and the prometheus-operator's CRDs
// (its own Go types).
var Kinds = map[string]func() any{
	"v1/ConfigMap":       func() any { return &corev1.ConfigMap{} },
	"v1/Service":         func() any { return &corev1.Service{} },
	"v1/Secret":          func() any { return &corev1.Secret{} },
	"apps/v1/Deployment": func() any { return &appsv1.Deployment{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Split cuts a multi-document YAML stream into its documents, leaving out
// the empty ones (only comments or blanks).
func Split(b []byte) [][]byte {
	var out [][]byte
	for _, d := range docSep.Split(string(b), -1) {
		empty := true
		for _, l := range bytes.Split([]byte(d), []byte("\n")) {
			l = bytes.TrimSpace(l)
			if len(l) > 0 && l[0] != '#' {
				empty = false
				break
			}
		}
		if !empty {
			out = append(out, []byte(d))
		}
	}
	return out
}

// Decode decodes one YAML document strictly into the Go type of its kind:
// an unknown field, a duplicate key, a wrong type or an unknown kind is an
// error. It returns the typed object and its kind key ("apps/v1/Deployment").
func Decode(doc []byte) (any, string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, "", err
	}
	key := tm.APIVersion + "/" + tm.Kind
	newObj, ok := Kinds[key]
	if !ok {
		return nil, key, fmt.Errorf("unknown kind %q", key)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, key, fmt.Errorf("%s: %w", key, err)
	}
	return obj, key, nil
}
