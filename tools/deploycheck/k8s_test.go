package deploycheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// root is the repository root, seen from this folder.
const root = "../.."

// need returns the path of a tool or ends the test: it fails under
// CI=true (scripts/test.sh installs every tool) and skips otherwise.
func need(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("FAILED: %s is not installed, and CI=true: run scripts/test.sh to install it", name)
	}
	t.Skipf("SKIPPED: %s is not installed: run scripts/test.sh to install it (with CI=true this fails)", name)
	return ""
}

// objects is a decoded set of manifests.
type objects struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	svcMonitors []*monitoringv1.ServiceMonitor
	podMonitors []*monitoringv1.PodMonitor
	promRules   []*monitoringv1.PrometheusRule
	kinds       map[string]int
}

func decodeAll(t *testing.T, what string, stream []byte) *objects {
	t.Helper()
	o := &objects{kinds: map[string]int{}}
	for i, doc := range Split(stream) {
		obj, key, err := Decode(doc)
		if err != nil {
			t.Errorf("%s, document %d: %v", what, i+1, err)
			continue
		}
		o.kinds[key]++
		switch v := obj.(type) {
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, v)
		case *corev1.Service:
			o.services = append(o.services, v)
		case *corev1.ConfigMap:
			o.configMaps = append(o.configMaps, v)
		case *corev1.Secret:
			o.secrets = append(o.secrets, v)
		case *monitoringv1.ServiceMonitor:
			o.svcMonitors = append(o.svcMonitors, v)
		case *monitoringv1.PodMonitor:
			o.podMonitors = append(o.podMonitors, v)
		case *monitoringv1.PrometheusRule:
			o.promRules = append(o.promRules, v)
		}
	}
	return o
}

// checkSidecarPod checks a pod template that runs tokentap beside an
// engine: tokentap is an init container with restartPolicy Always (a
// native sidecar), its ports are named, readiness is /readyz and liveness
// /healthz on a named port of its own, it runs as non-root, and every
// volume mount has its volume. It returns the sidecar container.
func checkSidecarPod(t *testing.T, what string, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	spec := d.Spec.Template.Spec
	sel := d.Spec.Selector.MatchLabels
	for k, v := range sel {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("%s: selector %s=%s does not match the pod template's labels %v", what, k, v, d.Spec.Template.Labels)
		}
	}
	var side *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "tokentap" {
			side = &spec.InitContainers[i]
		}
	}
	for _, c := range spec.Containers {
		if c.Name == "tokentap" {
			t.Errorf("%s: tokentap is a regular container; it must be a native sidecar (an init container with restartPolicy: Always)", what)
		}
	}
	if side == nil {
		t.Fatalf("%s: no tokentap init container", what)
	}
	if side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s: the tokentap init container's restartPolicy is %v, want Always (a native sidecar, Kubernetes 1.29+)", what, side.RestartPolicy)
	}
	ports := map[string]int32{}
	for _, p := range side.Ports {
		if p.Name == "" {
			t.Errorf("%s: unnamed sidecar port %d", what, p.ContainerPort)
		}
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] == 0 || ports["metrics"] == 0 {
		t.Errorf("%s: sidecar ports %v, want http and metrics", what, ports)
	}
	probe := func(kind string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no %s HTTP probe on the sidecar", what, kind)
			return
		}
		if p.HTTPGet.Path != path || p.HTTPGet.Port.Type != intstr.String || ports[p.HTTPGet.Port.StrVal] == 0 {
			t.Errorf("%s: %s probe %s on port %v, want %s on a named sidecar port", what, kind, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
		}
	}
	probe("readiness", side.ReadinessProbe, "/readyz")
	probe("liveness", side.LivenessProbe, "/healthz")
	sc := side.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s: the sidecar must run as a non-root user", what)
	}
	args := strings.Join(side.Args, " ")
	for _, want := range []string{"--upstream=http://127.0.0.1:", fmt.Sprintf("--listen=0.0.0.0:%d", ports["http"]), fmt.Sprintf("--admin-listen=0.0.0.0:%d", ports["metrics"])} {
		if !strings.Contains(args, want) {
			t.Errorf("%s: sidecar args %q lack %s", what, args, want)
		}
	}
	vols := map[string]bool{}
	for _, v := range spec.Volumes {
		vols[v.Name] = true
	}
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if c.Image == "" {
			t.Errorf("%s: container %s has no image", what, c.Name)
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				t.Errorf("%s: container %s mounts %s, which is not a volume", what, c.Name, m.Name)
			}
		}
	}
	if len(spec.Containers) == 0 {
		t.Errorf("%s: no engine container", what)
	}
	return side
}

// checkCapture checks the capture's wiring with fleet ids in a pod
// (docs/deploy.md, "Capture in Kubernetes"): the Secret named secret is
// mounted only by a plain init container before the sidecar, which runs
// `capture install-key` as the sidecar's user into a memory-backed
// emptyDir; the sidecar mounts that read-only, and its args point the
// capture's secret file there with fleet ids; POD_NAME names the replica
// once; the trace's directory is a volume.
func checkCapture(t *testing.T, what string, d *appsv1.Deployment, secret string) {
	t.Helper()
	spec := d.Spec.Template.Spec
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	sv := vols["tokentap-capture-secret"]
	if sv.Secret == nil || sv.Secret.SecretName != secret || sv.Secret.DefaultMode == nil || *sv.Secret.DefaultMode != 0o444 {
		t.Fatalf("%s: the capture's secret volume %+v, want Secret %s", what, sv.VolumeSource, secret)
	}
	if k := vols["tokentap-capture-key"]; k.EmptyDir == nil || k.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("%s: the key's volume %+v, want a memory-backed emptyDir", what, k.VolumeSource)
	}
	if _, ok := vols["tokentap-capture"]; !ok {
		t.Errorf("%s: no tokentap-capture volume for the trace", what)
	}
	if len(spec.InitContainers) < 2 || spec.InitContainers[0].Name != "tokentap-capture-key" || spec.InitContainers[1].Name != "tokentap" {
		t.Fatalf("%s: init containers %v, want tokentap-capture-key, then tokentap", what, spec.InitContainers)
	}
	key, side := spec.InitContainers[0], spec.InitContainers[1]
	if key.RestartPolicy != nil || key.Image != side.Image || strings.Join(key.Args, " ") != "capture install-key --from=/etc/tokentap-capture-secret/capture.key --to=/run/tokentap/capture.key" ||
		key.SecurityContext == nil || *key.SecurityContext.RunAsUser != *side.SecurityContext.RunAsUser {
		t.Errorf("%s: the key's init step %+v", what, key)
	}
	mounts := func(c corev1.Container) map[string]corev1.VolumeMount {
		m := map[string]corev1.VolumeMount{}
		for _, v := range c.VolumeMounts {
			m[v.Name] = v
		}
		return m
	}
	if m := mounts(key); m["tokentap-capture-key"].MountPath != "/run/tokentap" || m["tokentap-capture-secret"].MountPath != "/etc/tokentap-capture-secret" {
		t.Errorf("%s: the key step mounts %v", what, m)
	}
	for _, c := range append([]corev1.Container{side}, spec.Containers...) {
		if _, ok := mounts(c)["tokentap-capture-secret"]; ok {
			t.Errorf("%s: container %s mounts the Secret itself", what, c.Name)
		}
	}
	if m := mounts(side); !m["tokentap-capture-key"].ReadOnly || m["tokentap-capture-key"].MountPath != "/run/tokentap" || m["tokentap-capture"].MountPath != "/var/lib/tokentap" {
		t.Errorf("%s: the sidecar mounts %v", what, m)
	}
	args := strings.Join(side.Args, " ")
	for _, want := range []string{"--capture=/var/lib/tokentap/capture.jsonl", "--capture.ids=fleet", "--capture.secret-file=/run/tokentap/capture.key"} {
		if !strings.Contains(args, want) {
			t.Errorf("%s: sidecar args %q lack %s", what, args, want)
		}
	}
	pod := 0
	for _, e := range side.Env {
		if e.Name == "POD_NAME" {
			pod++
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s: POD_NAME %+v", what, e)
			}
		}
	}
	if pod != 1 {
		t.Errorf("%s: POD_NAME set %d times on the sidecar, want once", what, pod)
	}
}

// checkWiring checks that the Service sends clients to the sidecar's
// http port and that the monitors scrape its metrics port.
func checkWiring(t *testing.T, what string, o *objects) {
	t.Helper()
	for _, s := range o.services {
		names := map[string]bool{}
		for _, p := range s.Spec.Ports {
			names[p.Name] = true
			if p.TargetPort.Type != intstr.String || (p.TargetPort.StrVal != "http" && p.TargetPort.StrVal != "metrics") {
				t.Errorf("%s: Service %s port %s targets %s; want the sidecar's named ports (http, metrics), never the engine's", what, s.Name, p.Name, p.TargetPort.String())
			}
		}
		if !names["http"] {
			t.Errorf("%s: Service %s has no http port to the sidecar", what, s.Name)
		}
		for _, d := range o.deployments {
			for k, v := range s.Spec.Selector {
				if d.Spec.Template.Labels[k] != v {
					t.Errorf("%s: Service %s selects %s=%s, which deployment %s's pods lack", what, s.Name, k, v, d.Name)
				}
			}
		}
		for _, m := range o.svcMonitors {
			for _, e := range m.Spec.Endpoints {
				if !names[e.Port] {
					t.Errorf("%s: ServiceMonitor %s scrapes port %q, which Service %s lacks", what, m.Name, e.Port, s.Name)
				}
			}
			for k, v := range m.Spec.Selector.MatchLabels {
				if s.Labels[k] != v {
					t.Errorf("%s: ServiceMonitor %s selects %s=%s, which Service %s lacks", what, m.Name, k, v, s.Name)
				}
			}
		}
	}
	for _, m := range o.podMonitors {
		for _, e := range m.Spec.PodMetricsEndpoints {
			if e.Port == nil || *e.Port != "metrics" {
				t.Errorf("%s: PodMonitor %s scrapes port %v, want metrics", what, m.Name, e.Port)
			}
		}
	}
	for _, r := range o.promRules {
		if len(r.Spec.Groups) < 2 {
			t.Errorf("%s: PrometheusRule %s has %d groups", what, r.Name, len(r.Spec.Groups))
		}
	}
}

// checkConfig runs the sidecar's own validation on a configuration file
// (`--config.check`: every problem named, status 2 on any).
func checkConfig(t *testing.T, what, yamlText string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tokentap.yaml")
	os.WriteFile(f, []byte(yamlText), 0o644)
	cmd := exec.Command("go", "run", "./cmd/sidecar", "--config", f, "--config.check", "--upstream", "http://127.0.0.1:8000")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: the sidecar rejects its configuration: %v\n%s", what, err, out)
	}
}

func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(root, "deploy/kubernetes/*.yaml"))
	var all bytes.Buffer
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			// A kustomize file, not a Kubernetes object: checked
			// structurally (strictly, against the fields it may use).
			var k struct {
				APIVersion string   `json:"apiVersion"`
				Kind       string   `json:"kind"`
				Resources  []string `json:"resources"`
			}
			if err := yaml.UnmarshalStrict(b, &k); err != nil || k.Kind != "Kustomization" || len(k.Resources) == 0 {
				t.Errorf("%s: %v %+v", f, err, k)
			}
			for _, r := range k.Resources {
				if _, err := os.Stat(filepath.Join(filepath.Dir(f), r)); err != nil {
					t.Errorf("%s: resource %v", f, err)
				}
			}
			continue
		}
		fmt.Fprintf(&all, "%s\n---\n", b)
		one := decodeAll(t, f, b)
		if len(one.kinds) == 0 {
			t.Errorf("%s: no object", f)
		}
	}
	o := decodeAll(t, "deploy/kubernetes", all.Bytes())
	t.Logf("deploy/kubernetes decodes strictly: %v", o.kinds)
	if len(o.deployments) != 1 || len(o.services) != 1 || len(o.svcMonitors) != 1 || len(o.podMonitors) != 1 || len(o.promRules) != 1 || len(o.configMaps) != 1 {
		t.Fatalf("kinds %v", o.kinds)
	}
	side := checkSidecarPod(t, "deploy/kubernetes/deployment.yaml", o.deployments[0])
	if strings.Contains(strings.Join(side.Args, " "), "--capture") { // closed by default: the component turns it on
		t.Errorf("deploy/kubernetes/deployment.yaml: the base captures (%q); the capture component alone should", side.Args)
	}
	// The PodMonitor is the alternative to the ServiceMonitor: wired alone.
	checkWiring(t, "deploy/kubernetes", o)
	cfg := o.configMaps[0].Data["tokentap.yaml"]
	if cfg == "" {
		t.Fatal("configmap.yaml has no tokentap.yaml")
	}
	checkConfig(t, "deploy/kubernetes/configmap.yaml", cfg)
	// The deployment mounts that ConfigMap where the args point.
	found := false
	for _, v := range o.deployments[0].Spec.Template.Spec.Volumes {
		found = found || (v.ConfigMap != nil && v.ConfigMap.Name == o.configMaps[0].Name)
	}
	if !found {
		t.Errorf("deployment.yaml does not mount ConfigMap %s", o.configMaps[0].Name)
	}
}

// helmTemplate renders the chart with the given --set values.
func helmTemplate(t *testing.T, helm string, sets ...string) []byte {
	t.Helper()
	args := []string{"template", "rel", filepath.Join(root, "deploy/helm/tokentap"), "--namespace", "llm", "--kube-version", "1.31.0"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

func TestHelmChart(t *testing.T) {
	helm := need(t, "helm")
	chart := filepath.Join(root, "deploy/helm/tokentap")
	for _, args := range [][]string{
		{"lint", "--strict", chart, "--kube-version", "1.31.0"},
		{"lint", "--strict", chart, "--kube-version", "1.31.0", "--set", "podMonitor.enabled=true,serviceMonitor.enabled=false"},
		{"lint", "--strict", chart, "--kube-version", "1.31.0", "--set", "tokentap.capture.enabled=true"},
	} {
		out, err := exec.Command(helm, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "0 chart(s) failed") || strings.Contains(string(out), "[WARNING]") || strings.Contains(string(out), "[ERROR]") {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("helm %s: clean", strings.Join(args, " "))
		}
	}
	// An older cluster is refused: native sidecars need 1.29.
	if out, err := exec.Command(helm, "template", "rel", chart, "--kube-version", "1.28.9").CombinedOutput(); err == nil {
		t.Errorf("the chart renders for Kubernetes 1.28, which has no native sidecars:\n%.300s", out)
	}

	dashboards, _ := filepath.Glob(filepath.Join(root, "dashboards/*.json"))
	cases := []struct {
		name string
		sets []string
		want map[string]int
	}{
		{"the whole example (defaults)", nil, map[string]int{
			"apps/v1/Deployment": 1, "v1/Service": 1, "v1/ConfigMap": 1 + len(dashboards),
			"monitoring.coreos.com/v1/ServiceMonitor": 1, "monitoring.coreos.com/v1/PrometheusRule": 1}},
		{"beside a given engine container (SGLang), PodMonitor", []string{
			"engine.port=30000", "engine.container.name=sglang", "engine.container.image=lmsysorg/sglang:latest",
			"engine.container.args={python3,-m,sglang.launch_server,--model-path,Qwen/Qwen2.5-7B-Instruct,--port,30000}",
			"engine.container.ports[0].name=engine", "engine.container.ports[0].containerPort=30000",
			"engine.container.startupProbe=null", "engine.container.readinessProbe=null",
			"serviceMonitor.enabled=false", "podMonitor.enabled=true", "tokentap.image.tag=v1",
			"tokentap.extraArgs={--records=-}", "dashboards.namespace=monitoring"}, map[string]int{
			"apps/v1/Deployment": 1, "v1/Service": 1, "v1/ConfigMap": 1 + len(dashboards),
			"monitoring.coreos.com/v1/PodMonitor": 1, "monitoring.coreos.com/v1/PrometheusRule": 1}},
		{"capture with fleet ids: the chart's Secret", []string{"tokentap.capture.enabled=true"}, map[string]int{
			"apps/v1/Deployment": 1, "v1/Service": 1, "v1/ConfigMap": 1 + len(dashboards), "v1/Secret": 1,
			"monitoring.coreos.com/v1/ServiceMonitor": 1, "monitoring.coreos.com/v1/PrometheusRule": 1}},
		{"capture with fleet ids: an existing Secret, energy from DCGM", []string{"tokentap.capture.enabled=true",
			"tokentap.capture.existingSecret=fleet-key", "tokentap.energy.source=dcgm"}, map[string]int{
			"apps/v1/Deployment": 1, "v1/Service": 1, "v1/ConfigMap": 1 + len(dashboards),
			"monitoring.coreos.com/v1/ServiceMonitor": 1, "monitoring.coreos.com/v1/PrometheusRule": 1}},
		{"no workload: monitoring for pods of your own", []string{
			"workload.enabled=false", "service.selector.app=my-engine", "prometheusRule.enabled=false", "dashboards.enabled=false"}, map[string]int{
			"v1/Service": 1, "v1/ConfigMap": 1, "monitoring.coreos.com/v1/ServiceMonitor": 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := helmTemplate(t, helm, c.sets...)
			o := decodeAll(t, "helm template", out)
			if fmt.Sprint(o.kinds) != fmt.Sprint(c.want) {
				t.Errorf("rendered %v, want %v", o.kinds, c.want)
			}
			t.Logf("helm template decodes strictly into k8s.io/api and prometheus-operator types: %v", o.kinds)
			capture := strings.Contains(strings.Join(c.sets, ","), "capture.enabled=true")
			for _, d := range o.deployments {
				side := checkSidecarPod(t, "helm template", d)
				if capture {
					secret := "rel-tokentap-capture"
					if strings.Contains(strings.Join(c.sets, ","), "existingSecret") {
						secret = "fleet-key"
					}
					checkCapture(t, "helm template", d, secret)
					for _, s := range o.secrets {
						if k := s.Data["capture.key"]; s.Name != secret || len(k) < 32 {
							t.Errorf("Secret %s holds a key of %d bytes, want %s with at least 32", s.Name, len(k), secret)
						}
					}
					continue
				}
				if c.sets != nil {
					if !strings.Contains(strings.Join(side.Args, " "), "--upstream=http://127.0.0.1:30000") || side.Image != "tokentap:v1" ||
						d.Spec.Template.Spec.Containers[0].Name != "sglang" || side.Args[len(side.Args)-1] != "--records=-" {
						t.Errorf("values not applied: image %s args %v containers %s", side.Image, side.Args, d.Spec.Template.Spec.Containers[0].Name)
					}
				}
			}
			checkWiring(t, "helm template", o)
			dash := 0
			for _, cm := range o.configMaps {
				if cm.Labels["grafana_dashboard"] == "1" {
					dash++
					for name, js := range cm.Data {
						want, err := os.ReadFile(filepath.Join(root, "dashboards", name))
						if err != nil || js != string(want) {
							t.Errorf("dashboard ConfigMap %s: %s differs from dashboards/%s (%v)", cm.Name, name, name, err)
						}
					}
					if strings.Contains(strings.Join(c.sets, ","), "dashboards.namespace=monitoring") && cm.Namespace != "monitoring" {
						t.Errorf("dashboard ConfigMap %s in namespace %q", cm.Name, cm.Namespace)
					}
				} else if cfg := cm.Data["tokentap.yaml"]; cfg != "" {
					checkConfig(t, "the chart's tokentap.yaml", cfg)
				}
			}
			if c.want["v1/ConfigMap"] > 1 && dash != len(dashboards) {
				t.Errorf("%d dashboard ConfigMaps labelled grafana_dashboard=1, want %d", dash, len(dashboards))
			}
			for _, r := range o.promRules {
				// The chart's rules are the generated ones.
				b, _ := os.ReadFile(filepath.Join(root, "deploy/prometheus/tokentap-rules.yaml"))
				var plain monitoringv1.PrometheusRuleSpec
				if err := yaml.UnmarshalStrict(b, &plain); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(plain, r.Spec) {
					t.Errorf("the chart's PrometheusRule differs from deploy/prometheus/tokentap-rules.yaml")
				}
			}
		})
	}
}

// The capture component (deploy/kubernetes/capture): a kustomize
// Component whose JSON patch, applied to the base's Deployment as
// kustomize applies it (applyJSONPatch: every operation an add), gives a
// Deployment that still decodes strictly and carries the capture's
// wiring (checkCapture), its target the base's Deployment.
func TestKubernetesCaptureComponent(t *testing.T) {
	dir := filepath.Join(root, "deploy/kubernetes/capture")
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Patches    []struct {
			Path   string `json:"path"`
			Target struct {
				Group   string `json:"group"`
				Version string `json:"version"`
				Kind    string `json:"kind"`
				Name    string `json:"name"`
			} `json:"target"`
		} `json:"patches"`
	}
	if err := yaml.UnmarshalStrict(b, &k); err != nil || k.Kind != "Component" || k.APIVersion != "kustomize.config.k8s.io/v1alpha1" || len(k.Patches) != 1 {
		t.Fatalf("capture/kustomization.yaml: %v %+v", err, k)
	}
	base, err := os.ReadFile(filepath.Join(root, "deploy/kubernetes/deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	o := decodeAll(t, "deployment.yaml", base)
	if len(o.deployments) != 1 {
		t.Fatalf("deployment.yaml: %v", o.kinds)
	}
	p := k.Patches[0]
	if tg := p.Target; tg.Group != "apps" || tg.Version != "v1" || tg.Kind != "Deployment" || tg.Name != o.deployments[0].Name {
		t.Fatalf("the patch's target %+v, want the base's Deployment %s", tg, o.deployments[0].Name)
	}
	patch, err := os.ReadFile(filepath.Join(dir, p.Path))
	if err != nil {
		t.Fatal(err)
	}
	patched, err := applyJSONPatch(base, patch)
	if err != nil {
		t.Fatalf("applying %s: %v", p.Path, err)
	}
	o = decodeAll(t, "deployment.yaml with the capture component", patched)
	if len(o.deployments) != 1 {
		t.Fatalf("patched: %v", o.kinds)
	}
	checkSidecarPod(t, "deployment.yaml with the capture component", o.deployments[0])
	checkCapture(t, "deployment.yaml with the capture component", o.deployments[0], "tokentap-capture")
}

// applyJSONPatch applies the RFC 6902 patch (YAML) to the object doc
// (YAML) and returns the result (JSON): only "add", the operation the
// capture component uses, with RFC 6901 paths ("-" appends to an array,
// an index inserts before it); anything else is an error.
func applyJSONPatch(doc, patch []byte) ([]byte, error) {
	var obj any
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return nil, err
	}
	var ops []struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	if err := yaml.UnmarshalStrict(patch, &ops); err != nil {
		return nil, err
	}
	for _, op := range ops {
		if op.Op != "add" || !strings.HasPrefix(op.Path, "/") {
			return nil, fmt.Errorf("operation %q at %q: only add, at an absolute path", op.Op, op.Path)
		}
		var err error
		if obj, err = addAt(obj, strings.Split(op.Path[1:], "/"), op.Value); err != nil {
			return nil, fmt.Errorf("add at %s: %w", op.Path, err)
		}
	}
	return json.Marshal(obj)
}

// addAt adds v at the path's tokens under node and returns the node.
func addAt(node any, path []string, v any) (any, error) {
	tok := strings.NewReplacer("~1", "/", "~0", "~").Replace(path[0])
	last := len(path) == 1
	switch n := node.(type) {
	case map[string]any:
		if last {
			n[tok] = v
			return n, nil
		}
		child, ok := n[tok]
		if !ok {
			return nil, fmt.Errorf("no member %q", tok)
		}
		c, err := addAt(child, path[1:], v)
		n[tok] = c
		return n, err
	case []any:
		i := len(n)
		if tok != "-" {
			var err error
			if i, err = strconv.Atoi(tok); err != nil || i < 0 || i > len(n) {
				return nil, fmt.Errorf("index %q of an array of %d", tok, len(n))
			}
		}
		if last {
			return slices.Insert(n, i, v), nil
		}
		if i == len(n) {
			return nil, fmt.Errorf("index %q past the array's end", tok)
		}
		c, err := addAt(n[i], path[1:], v)
		n[i] = c
		return n, err
	}
	return nil, fmt.Errorf("%q under a value that is neither an object nor an array", tok)
}
