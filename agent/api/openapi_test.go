package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

type openAPIDoc struct {
	OpenAPI string `json:"openapi"`
	Paths   map[string]map[string]struct {
		Responses map[string]json.RawMessage `json:"responses"`
	} `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi = %q, want 3.1.0", doc.OpenAPI)
	}
	return doc
}

// jsonFields are the JSON names of a struct type's fields.
func jsonFields(typ reflect.Type) []string {
	var out []string
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIMatchesHandlers: every route the handler serves is documented
// and every documented path is served; every documented schema has exactly
// the fields of the Go type the handlers (and the Go client) read or write;
// every error code the handlers answer is in the Error enum and vice versa.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	doc := loadOpenAPI(t)
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(documented)
	routes := api.Routes()
	slices.Sort(routes)
	if !slices.Equal(documented, routes) {
		t.Errorf("documented operations %q, served routes %q", documented, routes)
	}

	types := []struct {
		schema string
		typ    any
	}{
		{"CreateRequest", api.CreateInput{}},
		{"CreateRequest", client.Call{}},
		{"Fact", api.Fact{}},
		{"Fact", client.Fact{}},
		{"Result", api.ResultInput{}},
		{"Result", client.Report{}},
		{"Outcome", api.ResultView{}},
		{"Outcome", client.Outcome{}},
		{"Claim", api.ClaimView{}},
		{"Claim", client.Claimed{}},
		{"RequestPage", api.ListView{}},
		{"RequestPage", client.Page{}},
		{"Withdrawal", api.WithdrawalInput{}},
		{"Withdrawal", client.Withdrawal{}},
		{"Key", api.KeyView{}},
		{"Key", client.Key{}},
		{"Request", api.RequestView{}},
		{"Request", client.Request{}},
		{"Signal", approval.Signal{}},
		{"Signal", client.Signal{}},
		{"WebhookEvent", api.Event{}},
		{"WebhookEvent", client.WebhookEvent{}},
		{"Error", api.ErrorDetail{}},
		{"ErrorBody", api.ErrorBody{}},
	}
	for _, tc := range types {
		typ := reflect.TypeOf(tc.typ)
		s, ok := doc.Components.Schemas[tc.schema]
		if !ok {
			t.Errorf("schema %s is not documented", tc.schema)
			continue
		}
		var props []string
		for p := range s.Properties {
			props = append(props, p)
		}
		slices.Sort(props)
		got := jsonFields(typ)
		if !slices.Equal(got, props) {
			t.Errorf("schema %s documents %q; %s has %q", tc.schema, props, typ, got)
		}
	}

	// Error codes: the ones the handlers answer, read from the source.
	var used []string
	codeRE := regexp.MustCompile(`Code: +"([a-z_]+)"`)
	for _, f := range []string{"api.go", "handlers.go", "list.go", "gone.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range codeRE.FindAllStringSubmatch(string(src), -1) {
			if !slices.Contains(used, m[1]) {
				used = append(used, m[1])
			}
		}
	}
	slices.Sort(used)
	enum := slices.Clone(doc.Components.Schemas["Error"].Properties["code"].Enum)
	slices.Sort(enum)
	if !slices.Equal(used, enum) {
		t.Errorf("error codes documented %q, answered by the handlers %q", enum, used)
	}
}

// TestOpenAPIServed: the document is served at /v1/openapi.json without a
// key, byte for byte the committed file, and every documented route
// reaches its handler (not the catch-all "no such endpoint").
func TestOpenAPIServed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	resp, err := http.Get(h.url + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !bytes.Equal(body, file) {
		t.Errorf("GET /v1/openapi.json = %d, %d bytes; want 200 and openapi.json (%d bytes)", resp.StatusCode, len(body), len(file))
	}
	for _, route := range api.Routes() {
		method, path, _ := strings.Cut(route, " ")
		req, _ := http.NewRequest(method, h.url+strings.ReplaceAll(path, "{id}", "req_x"), strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+fullKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "no such endpoint") {
			t.Errorf("%s: not served (%s)", route, b)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, h.url+"/v1/requests/req_x", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
		t.Errorf("DELETE a request = %d, want it refused (the API decides nothing)", resp.StatusCode)
	}
}
