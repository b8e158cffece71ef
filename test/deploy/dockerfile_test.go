package deploy_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with continuation lines joined.
type instruction struct {
	keyword string // upper case
	args    string
	line    int
}

// stage is one FROM ... section.
type stage struct {
	from  string
	name  string
	instr []instruction
}

func parseDockerfile(t *testing.T, path string) (global []instruction, stages []*stage) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cur strings.Builder
	start := 0
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		kw, args, _ := strings.Cut(text, " ")
		in := instruction{keyword: strings.ToUpper(kw), args: strings.TrimSpace(args), line: start}
		if in.keyword == "FROM" {
			f := strings.Fields(in.args)
			st := &stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				case st.from == "":
					st.from = f[i]
				}
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			global = append(global, in)
			return
		}
		stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, in)
	}
	for i, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 {
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			start = i + 1
		} else if strings.HasPrefix(trimmed, "#") {
			continue // comment inside a continued instruction
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return global, stages
}

func (s *stage) all(keyword string) []instruction {
	var out []instruction
	for _, in := range s.instr {
		if in.keyword == keyword {
			out = append(out, in)
		}
	}
	return out
}

var argRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// Builtin build args BuildKit defines for every stage that declares them
// (and $BUILDPLATFORM for FROM lines).
var automaticArgs = map[string]bool{"BUILDPLATFORM": true, "TARGETPLATFORM": true}

// lineage is st and the stages it is built FROM, base first, and the image
// the first of them starts from.
func lineage(t *testing.T, stages []*stage, st *stage) (image string, chain []*stage) {
	t.Helper()
	for cur := st; cur != nil; {
		chain = append([]*stage{cur}, chain...)
		image = cur.from
		next := (*stage)(nil)
		for _, s := range stages {
			if s.name != "" && s.name == cur.from && s != cur {
				next = s
			}
		}
		if len(chain) > len(stages) {
			t.Fatalf("stage %q: FROM loop", st.name)
		}
		cur = next
	}
	return image, chain
}

// allIn is every instruction with keyword in the stages of chain.
func allIn(chain []*stage, keyword string) []instruction {
	var out []instruction
	for _, s := range chain {
		out = append(out, s.all(keyword)...)
	}
	return out
}

// build/Dockerfile builds every released binary: the BINARY build arg says
// what the build stage compiles, and a target named after the binary is
// its runtime image (an exec-form ENTRYPOINT cannot use a build arg).
func TestDockerfilesBuildRealBinariesOnDistrolessNonroot(t *testing.T) {
	root := repoRoot(t)
	cmds, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var cmdNames []string
	for _, c := range cmds {
		if c.IsDir() {
			cmdNames = append(cmdNames, c.Name())
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "build"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "Dockerfile" && e.Name() != "Dockerfile.dockerignore" {
			t.Errorf("build/%s: build/ holds only the one Dockerfile (and its .dockerignore)", e.Name())
		}
	}
	global, stages := parseDockerfile(t, filepath.Join(root, "build", "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	declared := map[string]bool{}
	for _, in := range global {
		if in.keyword == "ARG" {
			name, _, _ := strings.Cut(in.args, "=")
			declared[name] = true
		}
	}
	for _, st := range stages {
		for _, m := range argRef.FindAllStringSubmatch(st.from, -1) {
			if !declared[m[1]] && !automaticArgs[m[1]] {
				t.Errorf("FROM %s uses $%s, which is not a global ARG", st.from, m[1])
			}
		}
	}

	build := stages[0]
	if !strings.HasPrefix(build.from, "golang:") {
		t.Errorf("build stage FROM %s, want a golang image", build.from)
	}
	stageArgs := map[string]bool{}
	var buildCmd string
	for _, in := range build.instr {
		switch in.keyword {
		case "ARG":
			name, _, _ := strings.Cut(in.args, "=")
			stageArgs[name] = true
		case "RUN":
			// Every ${X} a RUN uses must be declared in the stage
			// (a global ARG is not visible there).
			for _, m := range argRef.FindAllStringSubmatch(in.args, -1) {
				if !stageArgs[m[1]] {
					t.Errorf("line %d uses $%s, not declared with ARG in the build stage", in.line, m[1])
				}
			}
			if strings.Contains(in.args, "go build") {
				buildCmd = in.args
			}
		}
	}
	if buildCmd == "" {
		t.Fatal("no RUN go build in the build stage")
	}
	for _, want := range []string{"CGO_ENABLED=0", "-tags grpcnotrace ", "-o /out/${BINARY} ", "./cmd/${BINARY}"} {
		if !strings.Contains(buildCmd+" ", want) {
			t.Errorf("go build command %q lacks %q", buildCmd, want)
		}
	}
	for _, arg := range []string{"TARGETOS", "TARGETARCH", "BINARY"} {
		if !stageArgs[arg] {
			t.Errorf("build stage does not declare ARG %s", arg)
		}
	}
	// The version is embedded from internal/version/VERSION: no -X may
	// override it with something else.
	if strings.Contains(buildCmd, "-X ") {
		t.Errorf("go build command %q sets a variable with -X; the version comes from internal/version/VERSION", buildCmd)
	}

	// The targets: the stages with an ENTRYPOINT, each named after its binary.
	targets := map[string]*stage{}
	for _, st := range stages {
		if len(st.all("ENTRYPOINT")) > 0 {
			targets[st.name] = st
		}
	}
	imaged := slices.Sorted(maps.Keys(targets))
	want := slices.Sorted(slices.Values(releasedBinaries))
	if !slices.Equal(imaged, want) {
		t.Errorf("build/Dockerfile has targets for %v, want one per released binary %v", imaged, want)
	}
	// make image-docker builds each target with the same BINARY.
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "docker build -f build/Dockerfile --build-arg BINARY=$$b --target $$b ") {
		t.Error("Makefile: make image-docker does not build build/Dockerfile with --build-arg BINARY=$$b --target $$b")
	}

	for _, bin := range imaged {
		t.Run(bin, func(t *testing.T) {
			if !slices.Contains(cmdNames, bin) {
				t.Fatalf("target %s has no binary cmd/%s", bin, bin)
			}
			image, chain := lineage(t, stages, targets[bin])
			if !strings.HasPrefix(image, "gcr.io/distroless/static") || !strings.HasSuffix(image, ":nonroot") {
				t.Errorf("runtime stage FROM %s, want gcr.io/distroless/static...:nonroot", image)
			}
			if runs := allIn(chain, "RUN"); len(runs) > 0 {
				t.Errorf("runtime stage has RUN at line %d; it has no shell", runs[0].line)
			}
			if sh := allIn(chain, "SHELL"); len(sh) > 0 {
				t.Errorf("runtime stage sets SHELL at line %d", sh[0].line)
			}
			copies := allIn(chain, "COPY")
			if len(copies) != 1 || copies[0].args != "--from="+build.name+" /out/"+bin+" /"+bin {
				t.Errorf("runtime stage COPY = %+v, want exactly the binary from stage %q", copies, build.name)
			}
			users := allIn(chain, "USER")
			if len(users) != 1 || users[0].args != "65532:65532" {
				t.Errorf("USER = %+v, want 65532:65532 (the manifests' runAsUser)", users)
			}
			eps := allIn(chain, "ENTRYPOINT")
			if len(eps) != 1 {
				t.Fatalf("%d ENTRYPOINTs, want 1", len(eps))
			}
			var ep []string
			if err := json.Unmarshal([]byte(eps[0].args), &ep); err != nil {
				t.Fatalf("ENTRYPOINT %s is not the exec form (there is no shell): %v", eps[0].args, err)
			}
			if !slices.Equal(ep, []string{"/" + bin}) {
				t.Errorf("ENTRYPOINT %v, want [/%s]", ep, bin)
			}
		})
	}
}
