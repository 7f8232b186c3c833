package main_test

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	main "github.com/countersign/countersign/cmd/countersign"
)

// composeFile is what the tests read of compose.yaml.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

// composeService is one service of compose.yaml.
type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"` // the map form only
	Volumes     []any             `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Restart     string            `yaml:"restart"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// envNames is every variable Config reads from the environment (its
// envconfig tags): the names countersign serve knows.
func envNames() map[string]bool {
	names := map[string]bool{}
	t := reflect.TypeFor[main.Config]()
	for i := range t.NumField() {
		if name := t.Field(i).Tag.Get("envconfig"); name != "" {
			names[name] = true
		}
	}
	return names
}

// interpolated matches a Compose ${NAME}, ${NAME:-default}, ${NAME:?error}.
var interpolated = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)`)

// TestComposeFile reads compose.yaml, the first deployment the README and
// docs/deploy.md describe, against the binary it runs: every variable it
// passes to countersign is one Config reads (a renamed variable fails here,
// not on a user's machine), the ones serve requires are there, in Socket
// Mode; the variables it takes from .env are the ones .env.example lists;
// Redis keeps its data as docs/deploy.md requires; the health check runs a
// command the image has. .ci/run validates the same file with Docker's own
// `docker compose config`.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(moduleRoot, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	cs, ok := f.Services["countersign"]
	if !ok {
		t.Fatalf("compose.yaml has services %v, want countersign", slices.Sorted(maps.Keys(f.Services)))
	}
	redis, ok := f.Services["redis"]
	if !ok {
		t.Fatalf("compose.yaml has services %v, want redis", slices.Sorted(maps.Keys(f.Services)))
	}

	known := envNames()
	for name := range cs.Environment {
		if !known[name] {
			t.Errorf("compose.yaml passes %s to countersign, which Config (cmd/countersign/config/config.go) does not read", name)
		}
	}
	for _, name := range []string{"SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "REDIS_URL", "COUNTERSIGN_CONFIG", "COUNTERSIGN_ADDR"} {
		if cs.Environment[name] == "" {
			t.Errorf("compose.yaml: countersign's environment lacks %s", name)
		}
	}
	if _, ok := cs.Environment["SLACK_SIGNING_SECRET"]; ok {
		t.Errorf("compose.yaml sets SLACK_SIGNING_SECRET: Socket Mode takes SLACK_APP_TOKEN alone (serve refuses both)")
	}
	if cs.Environment["REDIS_URL"] != "redis://redis:6379/0" {
		t.Errorf("compose.yaml: REDIS_URL = %q, want the redis service, redis://redis:6379/0", cs.Environment["REDIS_URL"])
	}
	if got := cs.DependsOn["redis"].Condition; got != "service_healthy" {
		t.Errorf("compose.yaml: countersign depends_on redis condition %q, want service_healthy", got)
	}

	// The policy file is mounted read-only where COUNTERSIGN_CONFIG points.
	mounted := false
	for _, v := range cs.Volumes {
		m, _ := v.(map[string]any)
		if m["target"] == cs.Environment["COUNTERSIGN_CONFIG"] && m["read_only"] == true {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("compose.yaml mounts no read-only file at COUNTERSIGN_CONFIG %q: %v", cs.Environment["COUNTERSIGN_CONFIG"], cs.Volumes)
	}

	// The health check runs the image's own binary (distroless: no shell).
	d := parseDockerfile(t, filepath.Join(moduleRoot, "Dockerfile"))
	hc := cs.Healthcheck.Test
	if len(hc) < 3 || hc[0] != "CMD" || `["`+hc[1]+`"]` != d.entrypoint || hc[2] != "healthcheck" {
		t.Errorf("compose.yaml: countersign healthcheck %q, want [CMD <the Dockerfile's ENTRYPOINT %s> healthcheck ...]", hc, d.entrypoint)
	}
	_, port, _ := strings.Cut(cs.Environment["COUNTERSIGN_ADDR"], ":")
	if port != d.expose || len(cs.Ports) != 1 || !strings.HasSuffix(cs.Ports[0], ":"+port) {
		t.Errorf("compose.yaml: COUNTERSIGN_ADDR %q, ports %q; want the Dockerfile's EXPOSE %s published", cs.Environment["COUNTERSIGN_ADDR"], cs.Ports, d.expose)
	}

	// Redis as docs/deploy.md "Redis persistence" asks, on a named volume.
	redisArgs := strings.Join(redis.Command, " ")
	for _, want := range []string{"--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"} {
		if !strings.Contains(redisArgs, want) {
			t.Errorf("compose.yaml: redis command %q lacks %q (docs/deploy.md)", redisArgs, want)
		}
	}
	if !slices.ContainsFunc(redis.Volumes, func(v any) bool { s, _ := v.(string); return strings.HasSuffix(s, ":/data") }) {
		t.Errorf("compose.yaml: redis volumes %v, want a volume on /data", redis.Volumes)
	}
	for name, s := range map[string]composeService{"redis": redis, "countersign": cs} {
		if s.Restart == "" || s.Restart == "no" {
			t.Errorf("compose.yaml: %s restart %q, want a restart policy", name, s.Restart)
		}
	}

	// What .env fills in: .env.example lists exactly the variables
	// compose.yaml interpolates, and names no countersign variable that
	// compose.yaml would not pass on.
	var used []string
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, m := range interpolated.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(used, m[1]) {
				used = append(used, m[1])
			}
		}
	}
	sort.Strings(used)
	listed := readEnvExample(t, filepath.Join(moduleRoot, ".env.example"))
	if !slices.Equal(used, listed) {
		t.Errorf(".env.example lists %q, compose.yaml interpolates %q: they must be the same names", listed, used)
	}
}

// readEnvExample returns the sorted NAMEs of the NAME=value lines of path.
func readEnvExample(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: %q is not NAME=value", path, line)
			continue
		}
		names = append(names, name)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names
}
