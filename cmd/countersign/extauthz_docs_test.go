package main_test

import (
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	securityv1beta1 "istio.io/api/security/v1beta1"
)

// TestGatewaysDocEnvoy parses docs/gateways.md's Envoy ext_authz filter
// against go-control-plane's ExtAuthz type and its validation rules, and
// checks the settings a human wait needs: the body sent whole, fail
// closed, a timeout far above Envoy's 200 ms default.
func TestGatewaysDocEnvoy(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/gateways.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## Envoy (static configuration)")
	_, block, ok2 := strings.Cut(after, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/gateways.md has no yaml block under \"Envoy (static configuration)\"")
	}
	var bootstrap struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						TypedConfig struct {
							RouteConfig struct {
								VirtualHosts []struct {
									Routes []struct {
										PerFilter map[string]map[string]any `yaml:"typed_per_filter_config"`
									} `yaml:"routes"`
								} `yaml:"virtual_hosts"`
							} `yaml:"route_config"`
							HTTPFilters []struct {
								Name        string         `yaml:"name"`
								TypedConfig map[string]any `yaml:"typed_config"`
							} `yaml:"http_filters"`
						} `yaml:"typed_config"`
					} `yaml:"filters"`
				} `yaml:"filter_chains"`
			} `yaml:"listeners"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(block), &bootstrap); err != nil {
		t.Fatalf("docs/gateways.md Envoy config: %v", err)
	}
	var found, perRoute map[string]any
	for _, l := range bootstrap.StaticResources.Listeners {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				for _, vh := range f.TypedConfig.RouteConfig.VirtualHosts {
					for _, r := range vh.Routes {
						if pf := r.PerFilter["envoy.filters.http.ext_authz"]; pf != nil {
							perRoute = pf
						}
					}
				}
				for _, hf := range f.TypedConfig.HTTPFilters {
					if hf.Name == "envoy.filters.http.ext_authz" {
						found = hf.TypedConfig
					}
				}
			}
		}
	}
	if found == nil {
		t.Fatal("docs/gateways.md Envoy config has no envoy.filters.http.ext_authz filter")
	}
	if got, want := found["@type"], "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"; got != want {
		t.Errorf("ext_authz @type = %v, want %s", got, want)
	}
	delete(found, "@type")
	js, err := json.Marshal(found)
	if err != nil {
		t.Fatal(err)
	}
	var cfg extauthzv3.ExtAuthz
	if err := protojson.Unmarshal(js, &cfg); err != nil {
		t.Fatalf("ext_authz config does not parse as envoy.extensions.filters.http.ext_authz.v3.ExtAuthz: %v", err)
	}
	if err := cfg.ValidateAll(); err != nil {
		t.Fatalf("ext_authz config fails Envoy's validation: %v", err)
	}
	b := cfg.GetWithRequestBody()
	if cfg.GetFailureModeAllow() || b == nil || b.GetAllowPartialMessage() || b.GetMaxRequestBytes() == 0 || b.GetMaxRequestBytes() > 1<<20 {
		t.Errorf("ext_authz config %v: want failure_mode_allow false and the whole body, at most 1 MiB, sent", &cfg)
	}
	if to := cfg.GetGrpcService().GetTimeout().AsDuration(); to.Minutes() < 1 {
		t.Errorf("ext_authz grpc_service.timeout %v: want minutes, for a person to decide", to)
	}
	if cfg.GetGrpcService().GetEnvoyGrpc().GetClusterName() == "" {
		t.Error("ext_authz grpc_service names no cluster")
	}

	// The route's settings name it and its MCP server (context_extensions).
	if perRoute == nil {
		t.Fatal("docs/gateways.md Envoy config has no route with ext_authz settings (typed_per_filter_config)")
	}
	if got, want := perRoute["@type"], "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"; got != want {
		t.Errorf("per-route ext_authz @type = %v, want %s", got, want)
	}
	delete(perRoute, "@type")
	var pr extauthzv3.ExtAuthzPerRoute
	strictProto(t, "per-route ext_authz", perRoute, &pr)
	if err := pr.ValidateAll(); err != nil {
		t.Fatalf("per-route ext_authz fails Envoy's validation: %v", err)
	}
	if ext := pr.GetCheckSettings().GetContextExtensions(); ext["route"] == "" || ext["mcp_server"] == "" {
		t.Errorf("per-route context_extensions %v, want route and mcp_server", ext)
	}
}

// gatewaysDocBlocks returns the yaml blocks of docs/gateways.md under the
// heading that starts with heading, each split into its documents.
func gatewaysDocBlocks(t *testing.T, heading string) []map[string]any {
	t.Helper()
	doc, err := os.ReadFile("../../docs/gateways.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "\n"+heading)
	if !ok {
		t.Fatalf("docs/gateways.md has no heading %q", heading)
	}
	// The section ends at the next heading (a "# comment" line inside a
	// yaml block is no heading: headings here are ## or ###).
	if i := strings.Index(after, "\n##"); i >= 0 {
		after = after[:i]
	}
	var out []map[string]any
	for {
		_, rest, ok := strings.Cut(after, "```yaml\n")
		if !ok {
			break
		}
		block, rest, _ := strings.Cut(rest, "```")
		dec := yaml.NewDecoder(strings.NewReader(block))
		for {
			var m map[string]any
			if err := dec.Decode(&m); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("docs/gateways.md %s: %v", heading, err)
			}
			out = append(out, m)
		}
		after = rest
	}
	if len(out) == 0 {
		t.Fatalf("docs/gateways.md has no yaml under %q", heading)
	}
	return out
}

// strictProto parses v (a YAML value) into m as protojson, refusing
// unknown fields.
func strictProto(t *testing.T, what string, v any, m proto.Message) {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		t.Fatalf("%s does not parse as %s: %v", what, m.ProtoReflect().Descriptor().FullName(), err)
	}
}

// TestGatewaysDocIstio parses docs/gateways.md's Istio configuration
// against Istio's own types (istio.io/api): the extension provider as a
// MeshConfig's, the AuthorizationPolicy's spec, unknown fields refused;
// and checks what a human wait needs.
func TestGatewaysDocIstio(t *testing.T) {
	t.Parallel()
	docs := gatewaysDocBlocks(t, "## Istio")
	if len(docs) != 2 {
		t.Fatalf("Istio block has %d documents, want meshConfig and the AuthorizationPolicy", len(docs))
	}
	var mesh meshv1alpha1.MeshConfig
	strictProto(t, "meshConfig", docs[0]["meshConfig"], &mesh)
	var provider *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationGrpcProvider
	for _, p := range mesh.GetExtensionProviders() {
		if p.GetName() == "countersign" {
			provider = p.GetEnvoyExtAuthzGrpc()
		}
	}
	switch {
	case provider == nil:
		t.Fatal("meshConfig has no envoyExtAuthzGrpc provider named countersign")
	case provider.GetPort() != 9001 || provider.GetFailOpen() || provider.GetTimeout().AsDuration().Minutes() < 1:
		t.Errorf("provider %v: want port 9001, fail closed, a timeout of minutes", provider)
	case provider.GetIncludeRequestBodyInCheck().GetMaxRequestBytes() == 0 || provider.GetIncludeRequestBodyInCheck().GetAllowPartialMessage():
		t.Errorf("provider %v: want the whole body sent", provider)
	}
	ap := docs[1]
	if ap["apiVersion"] != "security.istio.io/v1" || ap["kind"] != "AuthorizationPolicy" {
		t.Errorf("second document is %v %v, want security.istio.io/v1 AuthorizationPolicy", ap["apiVersion"], ap["kind"])
	}
	var spec securityv1beta1.AuthorizationPolicy
	strictProto(t, "AuthorizationPolicy spec", ap["spec"], &spec)
	if spec.GetAction() != securityv1beta1.AuthorizationPolicy_CUSTOM || spec.GetProvider().GetName() != "countersign" {
		t.Errorf("AuthorizationPolicy %v: want action CUSTOM with provider countersign", &spec)
	}
}

// TestGatewaysDocK8s keeps the shape of docs/gateways.md's Envoy Gateway,
// Envoy AI Gateway and kgateway resources (no module serves their types;
// docs/gateways.md "How these were checked" says how their schemas were):
// each names its kind, sends the checks to Countersign's gRPC port, fails
// closed, waits minutes, and (where the gateway can) sends the route and
// the MCP server.
func TestGatewaysDocK8s(t *testing.T) {
	t.Parallel()
	path := func(m any, keys ...string) any {
		for _, k := range keys {
			mm, ok := m.(map[string]any)
			if !ok {
				return nil
			}
			m = mm[k]
		}
		return m
	}
	for _, tt := range []struct {
		heading, apiVersion, kind string
		extAuth                   []string
		port, timeout             []string
		contextExtensions         bool
	}{
		{"### Envoy Gateway", "gateway.envoyproxy.io/v1alpha1", "SecurityPolicy", []string{"spec", "extAuth"}, []string{"grpc", "backendRefs"}, []string{"timeout"}, true},
		{"### Envoy AI Gateway", "aigateway.envoyproxy.io/v1beta1", "MCPRoute", []string{"spec", "securityPolicy", "extAuth"}, []string{"grpc", "backendRefs"}, []string{"timeout"}, true},
		{"### kgateway", "gateway.kgateway.dev/v1alpha1", "GatewayExtension", []string{"spec", "extAuth"}, []string{"grpcService", "backendRef"}, []string{"grpcService", "requestTimeout"}, false},
	} {
		docs := gatewaysDocBlocks(t, tt.heading)
		d := docs[0]
		if d["apiVersion"] != tt.apiVersion || d["kind"] != tt.kind {
			t.Errorf("%s: %v %v, want %s %s", tt.heading, d["apiVersion"], d["kind"], tt.apiVersion, tt.kind)
			continue
		}
		ea := path(d, tt.extAuth...)
		port := path(ea, tt.port...)
		if l, ok := port.([]any); ok && len(l) > 0 {
			port = l[0]
		}
		if p, _ := path(port, "port").(int); p != 9001 {
			t.Errorf("%s: backend %v, want Countersign's gRPC port 9001", tt.heading, port)
		}
		if fo, ok := path(ea, "failOpen").(bool); !ok || fo {
			t.Errorf("%s: failOpen %v, want false", tt.heading, path(ea, "failOpen"))
		}
		to, _ := path(ea, tt.timeout...).(string)
		if d, err := time.ParseDuration(to); err != nil || d < time.Minute {
			t.Errorf("%s: timeout %q, want minutes for a person", tt.heading, to)
		}
		if tt.contextExtensions {
			names := map[string]bool{}
			for _, e := range path(ea, "contextExtensions").([]any) {
				if path(e, "type") == "Value" && path(e, "value") != "" {
					names[path(e, "name").(string)] = true
				}
			}
			if !names["route"] || !names["mcp_server"] {
				t.Errorf("%s: contextExtensions %v, want route and mcp_server", tt.heading, path(ea, "contextExtensions"))
			}
		}
	}
}
