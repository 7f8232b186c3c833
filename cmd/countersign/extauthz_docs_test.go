package main_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
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
	var found map[string]any
	for _, l := range bootstrap.StaticResources.Listeners {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
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
}
