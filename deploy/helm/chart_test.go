// Package helm holds the tests of the Helm chart in deploy/helm/kvtier:
// rendered by the helm binary for the default values and every values file
// of examples/kubernetes, every object decoded strictly into the
// Kubernetes API's types, and the invariants a working installation needs
// checked on what was rendered (issue 43). No cluster is needed.
package helm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/kvtier/kvtier/config"
)

// measuredOverheadMiB is the daemon's memory beyond its arenas that the
// memory limit must leave: at most 423 MiB with 0.25 to 4 GiB primaries
// filled through the copying API (BENCHMARKS.md, "Kubernetes").
const measuredOverheadMiB = 448

const chartDir = "kvtier"

// helmBinary returns the helm to render with: $KVTIER_HELM, the suite's
// .tools/bin/helm, or helm on PATH.
func helmBinary(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("KVTIER_HELM"), filepath.Join("..", "..", ".tools", "bin", "helm")} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if os.Getenv("KVTIER_REQUIRE_INTEGRATION") != "" {
		t.Fatal("no helm binary (./scripts/test.sh installs one into .tools/bin)")
	}
	t.Skip("no helm binary: run ./scripts/test.sh, or set KVTIER_HELM")
	return ""
}

var (
	buildOnce sync.Once
	kvtierBin string
	buildErr  error
)

// kvtierBinary builds the daemon once, for --check-config.
func kvtierBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvtier-helm")
		if err != nil {
			buildErr = err
			return
		}
		kvtierBin = filepath.Join(dir, "kvtier")
		out, err := exec.Command("go", "build", "-o", kvtierBin, "../../cmd/kvtier").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return kvtierBin
}

// rendered is a chart's render, decoded.
type rendered struct {
	daemonSets  []*appsv1.DaemonSet
	deployments []*appsv1.Deployment
	configMaps  map[string]*corev1.ConfigMap
	services    []*corev1.Service
	monitors    []map[string]any // ServiceMonitor, PrometheusRule
}

// decodeStrict decodes every document of out into its Kubernetes type;
// a field the type does not have, or a kind the chart should not make,
// is an error.
func decodeStrict(out []byte, into *rendered) error {
	if into.configMaps == nil {
		into.configMaps = map[string]*corev1.ConfigMap{}
	}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
		var head struct{ APIVersion, Kind string }
		if err := json.Unmarshal(js, &head); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
		strict := func(v any) error {
			d := json.NewDecoder(bytes.NewReader(js))
			d.DisallowUnknownFields()
			if err := d.Decode(v); err != nil {
				return fmt.Errorf("document %d (%s): %w", i, head.Kind, err)
			}
			return nil
		}
		switch head.APIVersion + "/" + head.Kind {
		case "apps/v1/DaemonSet":
			var o appsv1.DaemonSet
			if err := strict(&o); err != nil {
				return err
			}
			into.daemonSets = append(into.daemonSets, &o)
		case "apps/v1/Deployment":
			var o appsv1.Deployment
			if err := strict(&o); err != nil {
				return err
			}
			into.deployments = append(into.deployments, &o)
		case "v1/ConfigMap":
			var o corev1.ConfigMap
			if err := strict(&o); err != nil {
				return err
			}
			into.configMaps[o.Name] = &o
		case "v1/Service":
			var o corev1.Service
			if err := strict(&o); err != nil {
				return err
			}
			into.services = append(into.services, &o)
		case "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule":
			var o map[string]any
			if err := json.Unmarshal(js, &o); err != nil {
				return err
			}
			into.monitors = append(into.monitors, o)
		default:
			return fmt.Errorf("document %d: unexpected kind %s %s", i, head.APIVersion, head.Kind)
		}
	}
	return nil
}

func render(t *testing.T, valuesFile string) *rendered {
	t.Helper()
	args := []string{"template", "kvtier", chartDir, "--namespace", "inference"}
	lint := []string{"lint", "--strict", chartDir}
	if valuesFile != "" {
		args = append(args, "-f", valuesFile)
		lint = append(lint, "-f", valuesFile)
	}
	if out, err := exec.Command(helmBinary(t), lint...).CombinedOutput(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(lint, " "), err, out)
	}
	out, err := exec.Command(helmBinary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var r rendered
	if err := decodeStrict(out, &r); err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	return &r
}

// engineExamples decodes examples/kubernetes' engine Deployments.
func engineExamples(t *testing.T) *rendered {
	t.Helper()
	var r rendered
	files, _ := filepath.Glob("../../examples/kubernetes/*.yaml")
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "values-") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := decodeStrict(b, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if len(r.deployments) < 3 {
		t.Fatalf("%d engine examples, want vLLM in both modes and SGLang", len(r.deployments))
	}
	return &r
}

// secretKeys are configuration keys that hold secrets: a ConfigMap must
// name where they come from (token_env, a file), never hold them.
var secretKeys = []string{"token", "auth_token", "password", "secret_key", "access_key", "session_token"}

// invariants returns what is wrong with a render and the engine examples
// meant to run beside it; checkConfig validates a kvtier configuration as
// the daemon would.
func invariants(r, engines *rendered, checkConfig func(yaml string) error) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if len(r.daemonSets) != 1 {
		return []string{fmt.Sprintf("%d DaemonSets, want 1", len(r.daemonSets))}
	}
	ds := r.daemonSets[0]
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return []string{fmt.Sprintf("%d containers, want the daemon", len(pod.Containers))}
	}
	c := pod.Containers[0]

	// Labels and selectors.
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			fail("the DaemonSet's selector %s=%s does not select its pods", k, v)
		}
	}
	for _, s := range r.services {
		for k, v := range s.Spec.Selector {
			if ds.Spec.Template.Labels[k] != v {
				fail("Service %s selects %s=%s, which the daemon's pods lack", s.Name, k, v)
			}
		}
	}

	// Monitoring: the ServiceMonitor selects the Service, the rules and the
	// dashboard are there whole.
	for _, m := range r.monitors {
		spec, _ := m["spec"].(map[string]any)
		switch m["kind"] {
		case "ServiceMonitor":
			sel, _ := spec["selector"].(map[string]any)
			labels, _ := sel["matchLabels"].(map[string]any)
			found := false
			for _, s := range r.services {
				ok := len(labels) > 0
				for k, v := range labels {
					ok = ok && s.Labels[k] == v
				}
				found = found || ok
			}
			if !found {
				fail("the ServiceMonitor selects no Service (%v)", labels)
			}
		case "PrometheusRule":
			if groups, _ := spec["groups"].([]any); len(groups) == 0 {
				fail("the PrometheusRule has no rule groups")
			}
		}
	}
	for name, cm := range r.configMaps {
		if js, ok := cm.Data["kvtier.json"]; ok && !json.Valid([]byte(js)) {
			fail("the dashboard ConfigMap %s holds no valid JSON", name)
		}
	}

	// The configuration: valid, without secrets, its env vars from Secrets.
	var cfgText string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.Name == "config" {
			if cm := r.configMaps[v.ConfigMap.Name]; cm != nil {
				cfgText = cm.Data["kvtier.yaml"]
			}
		}
	}
	if cfgText == "" {
		return append(bad, "the daemon mounts no ConfigMap with kvtier.yaml")
	}
	if err := checkConfig(cfgText); err != nil {
		fail("kvtier serve --check-config refuses the rendered config: %v", err)
	}
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		return append(bad, fmt.Sprintf("the rendered config: %v", err))
	}
	for name, cm := range r.configMaps {
		for key, data := range cm.Data {
			if strings.Contains(data, "-----BEGIN") {
				fail("ConfigMap %s/%s holds PEM material", name, key)
			}
			var doc any
			if yaml.Unmarshal([]byte(data), &doc) == nil {
				walkKeys(doc, func(k string, v any) {
					if s, ok := v.(string); ok && s != "" && slices.Contains(secretKeys, k) {
						fail("ConfigMap %s/%s holds a secret under %q", name, key, k)
					}
				})
			}
		}
	}
	envFromSecret := map[string]bool{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			envFromSecret[e.Name] = true
		}
	}
	var doc any
	_ = yaml.Unmarshal([]byte(cfgText), &doc)
	walkKeys(doc, func(k string, v any) {
		if s, ok := v.(string); ok && strings.HasSuffix(k, "token_env") && !envFromSecret[s] {
			fail("the config reads $%s (%s), which no Secret sets", s, k)
		}
	})

	// The socket: in a host directory the daemon mounts, which every engine
	// example mounts from the same host path at the same path.
	sockDir := filepath.Dir(cfg.Server.UnixSocket)
	hostDir := ""
	for _, m := range c.VolumeMounts {
		if m.MountPath == sockDir {
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.HostPath != nil {
					hostDir = v.HostPath.Path
				}
			}
		}
	}
	if hostDir == "" {
		fail("the daemon's socket directory %s is not a hostPath volume", sockDir)
	}
	engineCM := r.configMaps["kvtier-engine"]
	if engineCM == nil {
		fail("no engine ConfigMap kvtier-engine")
	} else {
		for key, js := range engineCM.Data {
			if !strings.HasSuffix(key, ".json") {
				continue
			}
			if !strings.Contains(js, `"unix://`+cfg.Server.UnixSocket+`"`) {
				fail("engine configuration %s does not target unix://%s: %s", key, cfg.Server.UnixSocket, js)
			}
			if !json.Valid([]byte(js)) {
				fail("engine configuration %s is not JSON", key)
			}
		}
	}
	for _, d := range engines.deployments {
		ep := d.Spec.Template.Spec
		mounted := false
		for _, ec := range ep.Containers {
			for _, m := range ec.VolumeMounts {
				for _, v := range ep.Volumes {
					if v.Name == m.Name && v.HostPath != nil && v.HostPath.Path == hostDir && m.MountPath == sockDir {
						mounted = true
					}
					if v.Name == m.Name && v.ConfigMap != nil && r.configMaps[v.ConfigMap.Name] == nil {
						fail("engine example %s mounts ConfigMap %s, which the chart does not make", d.Name, v.ConfigMap.Name)
					}
				}
			}
		}
		if !mounted {
			fail("engine example %s does not mount host directory %s at %s", d.Name, hostDir, sockDir)
		}
	}

	// Memory: the primaries and the measured overhead fit the limit.
	need := int64(cfg.Primary.Bytes) + measuredOverheadMiB<<20
	if cfg.Engines.On() {
		need += int64(cfg.Engines.PrimaryBytes)
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		fail("the daemon has no memory limit")
	} else if limit.Value() < need {
		fail("memory limit %s < primaries + measured overhead %s", limit.String(), resource.NewQuantity(need, resource.BinarySI))
	}

	// Probes: on the metrics address, at endpoints the daemon serves.
	_, metricsPort, _ := net.SplitHostPort(cfg.Server.MetricsAddr)
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.HTTPGet == nil {
			fail("no %s probe over HTTP", name)
			continue
		}
		if !slices.Contains([]string{"/healthz", "/readyz"}, p.HTTPGet.Path) {
			fail("%s probe on %s: the daemon serves /healthz and /readyz", name, p.HTTPGet.Path)
		}
		port := p.HTTPGet.Port.String()
		for _, cp := range c.Ports {
			if cp.Name == port {
				port = fmt.Sprint(cp.ContainerPort)
			}
		}
		if port != metricsPort {
			fail("%s probe on port %s, the metrics address is %s", name, port, cfg.Server.MetricsAddr)
		}
	}

	// Grace: the drain fits in the pod's termination grace period.
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g < int64(cfg.Server.ShutdownTimeout.Value().Seconds())+5 {
		fail("terminationGracePeriodSeconds %v does not leave server.shutdown_timeout %v to drain", g, cfg.Server.ShutdownTimeout.Value())
	}
	// Without root where nothing needs it.
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		fail("the daemon may run as root or escalate privileges")
	}
	return bad
}

// walkKeys calls fn for every key of every map in v, recursively.
func walkKeys(v any, fn func(key string, val any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			fn(k, val)
			walkKeys(val, fn)
		}
	case []any:
		for _, e := range x {
			walkKeys(e, fn)
		}
	}
}

// checkConfigWith returns a checker running kvtier serve --check-config.
func checkConfigWith(t *testing.T) func(string) error {
	bin := kvtierBinary(t)
	dir := t.TempDir()
	return func(text string) error {
		path := filepath.Join(dir, "kvtier.yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			return err
		}
		out, err := exec.Command(bin, "serve", "--config", path, "--check-config").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
}

// TestChart renders the chart for the default values and every values file
// of examples/kubernetes and checks the invariants.
func TestChart(t *testing.T) {
	engines := engineExamples(t)
	check := checkConfigWith(t)
	files, _ := filepath.Glob("../../examples/kubernetes/values-*.yaml")
	if len(files) < 4 {
		t.Fatalf("%d values files in examples/kubernetes", len(files))
	}
	for _, f := range append([]string{""}, files...) {
		name := "defaults"
		if f != "" {
			name = filepath.Base(f)
		}
		t.Run(name, func(t *testing.T) {
			r := render(t, f)
			for _, v := range invariants(r, engines, check) {
				t.Error(v)
			}
		})
	}
}

// The invariants catch what they are for: each mutation of a good render
// is found.
func TestChartInvariantsCatchMutations(t *testing.T) {
	engines := engineExamples(t)
	check := checkConfigWith(t)
	for _, tc := range []struct {
		name   string
		mutate func(r *rendered)
		want   string
	}{
		{"socket directory moved", func(r *rendered) {
			for i := range r.daemonSets[0].Spec.Template.Spec.Volumes {
				if v := &r.daemonSets[0].Spec.Template.Spec.Volumes[i]; v.HostPath != nil && v.Name == "socket-dir" {
					v.HostPath.Path = "/var/run/elsewhere"
				}
			}
		}, "does not mount host directory /var/run/elsewhere"},
		{"a token in the ConfigMap", func(r *rendered) {
			cm := r.configMaps["kvtier"]
			cm.Data["kvtier.yaml"] += "tenants: [{name: a, token: a-token-of-sixteen-bytes, namespaces: [default]}]\n"
		}, `holds a secret under "token"`},
		{"memory limit below the primaries", func(r *rendered) {
			r.daemonSets[0].Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1Gi")
		}, "memory limit 1Gi < primaries"},
		{"probe on a path the daemon does not serve", func(r *rendered) {
			r.daemonSets[0].Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Path = "/health"
		}, "liveness probe on /health"},
		{"a config the daemon refuses", func(r *rendered) {
			r.configMaps["kvtier"].Data["kvtier.yaml"] += "colour: blue\n"
		}, "--check-config refuses"},
		{"Service selecting other pods", func(r *rendered) {
			r.services[0].Spec.Selector["app.kubernetes.io/instance"] = "other"
		}, "which the daemon's pods lack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, "")
			if bad := invariants(r, engines, check); len(bad) > 0 {
				t.Fatalf("the default render is already wrong: %q", bad)
			}
			tc.mutate(r)
			bad := invariants(r, engines, check)
			if !slices.ContainsFunc(bad, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("mutation not caught: %q, want %q", bad, tc.want)
			}
		})
	}
}
