package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/template"

	"github.com/spf13/pflag"

	"github.com/latchcsi/latch/internal/diagnose"
	"github.com/latchcsi/latch/internal/diagnose/render"
)

// Shells latchctl writes completion scripts for.
var completionShells = []string{"bash", "zsh", "fish"}

// command is one latchctl command, for usage-like lists.
type command struct{ Name, Help string }

func commands() []command {
	return []command{
		{"explain", "explain where a volume stands in the attach pipeline"},
		{"status", "table of VolumeAttachments"},
		{"completion", "shell completion script (bash, zsh, fish)"},
		{"version", "latchctl's version"},
	}
}

// completionFlag is a flag as the scripts need it.
type completionFlag struct {
	Long, Short, Help string
	// Values is what the flag's value completes to: a word list, or
	// one of the names below.
	Values []string
	// Kind is "file", "namespace", "context", "driver", "none" (a value
	// nobody can guess, a duration) or "" (a switch, no value).
	Kind string
}

// completionData is what the script templates read; everything comes from
// the flag set and the lists the code validates against, so the scripts
// cannot drift from the command line.
type completionData struct {
	Prog          string
	Commands      []command
	Kinds         []string
	KindNames     []kindNames
	Shells        []string
	Flags         []completionFlag
	ExplainFormat []string
	StatusFormat  []string
	AllFormats    []string
}

func newCompletionData(prog string) completionData {
	d := completionData{Prog: prog, Commands: commands(), Kinds: primaryKinds(), KindNames: kindNamesOf(), Shells: completionShells}
	for _, f := range render.ExplainFormats() {
		d.ExplainFormat = append(d.ExplainFormat, string(f))
	}
	for _, f := range render.StatusFormats() {
		d.StatusFormat = append(d.StatusFormat, string(f))
	}
	d.AllFormats = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(d.ExplainFormat), d.StatusFormat...))))
	var sortKeys []string
	for _, k := range diagnose.SortKeys() {
		sortKeys = append(sortKeys, string(k))
	}
	fs := newFlagSet(&Config{})
	fs.VisitAll(func(f *pflag.Flag) {
		cf := completionFlag{Long: f.Name, Short: f.Shorthand, Help: f.Usage}
		switch {
		case f.Value.Type() == "bool":
		case f.Name == "kubeconfig":
			cf.Kind = "file"
		case f.Name == "namespace":
			cf.Kind = "namespace"
		case f.Name == "context":
			cf.Kind = "context"
		case f.Name == "driver":
			cf.Kind = "driver"
		case f.Name == "output":
			cf.Values = d.AllFormats
		case f.Name == "sort-by":
			cf.Values = sortKeys
		default:
			cf.Kind = "none"
		}
		d.Flags = append(d.Flags, cf)
	})
	// pflag answers -h and --help without defining them.
	d.Flags = append(d.Flags, completionFlag{Long: "help", Short: "h", Help: "show the usage"})
	return d
}

// kindNames are the names explain accepts for one kind, and the kubectl
// resource that lists its objects.
type kindNames struct {
	Aliases  []string
	Resource string
}

func kindNamesOf() []kindNames {
	resources := map[diagnose.TargetKind]string{diagnose.TargetPod: "pods", diagnose.TargetPVC: "persistentvolumeclaims",
		diagnose.TargetPV: "persistentvolumes", diagnose.TargetVA: "volumeattachments"}
	var out []kindNames
	for _, k := range primaryKinds() {
		kn := kindNames{Resource: resources[diagnose.TargetKind(k)]}
		for alias, kind := range kindAliases() {
			if string(kind) == k {
				kn.Aliases = append(kn.Aliases, alias)
			}
		}
		slices.Sort(kn.Aliases)
		out = append(out, kn)
	}
	return out
}

// primaryKinds are the kinds explain takes, by their short names.
func primaryKinds() []string {
	return []string{string(diagnose.TargetPod), string(diagnose.TargetPVC), string(diagnose.TargetPV), string(diagnose.TargetVA)}
}

// TakesValue reports whether the flag reads the next word as its value.
func (f completionFlag) TakesValue() bool { return f.Kind != "" || f.Values != nil }

// writeCompletion writes the completion script of shell for prog (the
// binary's name, latchctl).
func writeCompletion(w io.Writer, shell, prog string) error {
	t, ok := completionTemplates[shell]
	if !ok {
		return fmt.Errorf("%w: completion %q: want one of %v", errUsage, shell, completionShells)
	}
	return template.Must(template.New(shell).Funcs(template.FuncMap{
		"join":  strings.Join,
		"quote": func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" },
		// An option's description is in [...] of a single-quoted spec.
		"zsh":   func(s string) string { return strings.NewReplacer("'", `'\''`, "[", `\[`, "]", `\]`).Replace(s) },
		"ident": func(s string) string { return strings.NewReplacer("-", "_", " ", "_").Replace(s) },
	}).Parse(t)).Execute(w, newCompletionData(prog))
}

var completionTemplates = map[string]string{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}

// The names a kind's objects complete to, read with kubectl (the scripts
// pass on --kubeconfig, --context and -n); nothing when kubectl is
// missing or cannot reach the cluster.

const bashCompletion = `# bash completion for {{.Prog}}. Load it with
#   source <({{.Prog}} completion bash)
# or write it to a file in /etc/bash_completion.d/.

_{{ident .Prog}}_kubectl() {
    local i kargs=()
    for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do
        case "${COMP_WORDS[i]}" in
            --kubeconfig|--context|-n|--namespace) kargs+=("${COMP_WORDS[i]}" "${COMP_WORDS[i+1]}") ;;
            --kubeconfig=*|--context=*|--namespace=*) kargs+=("${COMP_WORDS[i]}") ;;
        esac
    done
    command -v kubectl >/dev/null 2>&1 || return 0
    kubectl "${kargs[@]}" "$@" -o 'jsonpath={.items[*].metadata.name}' --request-timeout=5s 2>/dev/null
}

_{{ident .Prog}}() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local i w cmd="" args=()
    COMPREPLY=()
    # The command and its arguments: the words that are neither flags
    # nor flag values (flags may come anywhere).
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
{{- range .Flags}}{{if .TakesValue}}
            --{{.Long}}{{if .Short}}|-{{.Short}}{{end}}) ((i++)) ;;
{{- end}}{{end}}
            -*) ;;
            *) if [[ -z "$cmd" ]]; then cmd="$w"; else args+=("$w"); fi ;;
        esac
    done
    case "$prev" in
{{- range .Flags}}{{if .TakesValue}}
        --{{.Long}}{{if .Short}}|-{{.Short}}{{end}})
{{- if eq .Kind "file"}}
            COMPREPLY=($(compgen -f -- "$cur")); return ;;
{{- else if eq .Kind "namespace"}}
            COMPREPLY=($(compgen -W "$(_{{ident $.Prog}}_kubectl get namespaces)" -- "$cur")); return ;;
{{- else if eq .Kind "context"}}
            COMPREPLY=($(compgen -W "$(command -v kubectl >/dev/null 2>&1 && kubectl config get-contexts -o name 2>/dev/null)" -- "$cur")); return ;;
{{- else if eq .Kind "driver"}}
            COMPREPLY=($(compgen -W "$(_{{ident $.Prog}}_kubectl get csidrivers)" -- "$cur")); return ;;
{{- else if eq .Long "output"}}
            case "$cmd" in
                explain) COMPREPLY=($(compgen -W "{{join $.ExplainFormat " "}}" -- "$cur")) ;;
                status) COMPREPLY=($(compgen -W "{{join $.StatusFormat " "}}" -- "$cur")) ;;
                *) COMPREPLY=($(compgen -W "{{join .Values " "}}" -- "$cur")) ;;
            esac
            return ;;
{{- else if .Values}}
            COMPREPLY=($(compgen -W "{{join .Values " "}}" -- "$cur")); return ;;
{{- else}}
            return ;;
{{- end}}
{{- end}}{{end}}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "{{range .Flags}}--{{.Long}} {{if .Short}}-{{.Short}} {{end}}{{end}}" -- "$cur"))
        return
    fi
    case "$cmd" in
        "")
            COMPREPLY=($(compgen -W "{{range .Commands}}{{.Name}} {{end}}help" -- "$cur")) ;;
        explain)
            if ((${#args[@]} == 0)); then
                COMPREPLY=($(compgen -W "{{join .Kinds " "}}" -- "$cur"))
            elif ((${#args[@]} == 1)); then
                case "${args[0]}" in
{{- range .KindNames}}
                    {{join .Aliases "|"}}) COMPREPLY=($(compgen -W "$(_{{ident $.Prog}}_kubectl get {{.Resource}})" -- "$cur")) ;;
{{- end}}
                esac
            fi ;;
        completion)
            ((${#args[@]} == 0)) && COMPREPLY=($(compgen -W "{{join .Shells " "}}" -- "$cur")) ;;
    esac
}

complete -F _{{ident .Prog}} {{.Prog}}
`

const zshCompletion = `#compdef {{.Prog}}
# zsh completion for {{.Prog}}. Load it with
#   source <({{.Prog}} completion zsh)
# or write it as _{{.Prog}} into a directory of $fpath.

_{{ident .Prog}}_kubectl() {
    local -a kargs
    local i
    for ((i = 2; i < CURRENT; i++)); do
        case $words[i] in
            --kubeconfig|--context|-n|--namespace) kargs+=($words[i] $words[i+1]) ;;
            --kubeconfig=*|--context=*|--namespace=*) kargs+=($words[i]) ;;
        esac
    done
    (( $+commands[kubectl] )) || return 0
    kubectl $kargs "$@" -o 'jsonpath={.items[*].metadata.name}' --request-timeout=5s 2>/dev/null
}

_{{ident .Prog}}_names() {
    local -a names
    names=(${(z)"$(_{{ident .Prog}}_kubectl get $1)"})
    _describe -t names "$1" names
}

_{{ident .Prog}}() {
    local curcontext="$curcontext" state line
    local -a commands
    commands=(
{{- range .Commands}}
        {{quote (printf "%s:%s" .Name .Help)}}
{{- end}}
    )
    _arguments -C \
{{- range .Flags}}
        {{if .Short}}'(-{{.Short}} --{{.Long}})'{-{{.Short}},--{{.Long}}}{{else}}'--{{.Long}}{{if .TakesValue}}={{end}}'{{end}}'[{{zsh .Help}}]{{if .TakesValue}}:{{.Long}}:{{if eq .Kind "file"}}_files{{else if eq .Kind "namespace"}}{_{{ident $.Prog}}_names namespaces}{{else if eq .Kind "context"}}{_values context ${(f)"$(kubectl config get-contexts -o name 2>/dev/null)"}}{{else if eq .Kind "driver"}}{_{{ident $.Prog}}_names csidrivers}{{else if .Values}}({{join .Values " "}}){{else}} {{end}}{{end}}' \
{{- end}}
        '1:command:->command' \
        '*::argument:->argument'
    case $state in
        command)
            _describe -t commands '{{.Prog}} command' commands ;;
        argument)
            case $line[1] in
                explain)
                    if (( CURRENT == 2 )); then
                        _values kind {{join .Kinds " "}}
                    elif (( CURRENT == 3 )); then
                        case $words[2] in
{{- range .KindNames}}
                            {{join .Aliases "|"}}) _{{ident $.Prog}}_names {{.Resource}} ;;
{{- end}}
                        esac
                    fi ;;
                completion)
                    (( CURRENT == 2 )) && _values shell {{join .Shells " "}} ;;
            esac ;;
    esac
}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _{{ident .Prog}} "$@"
else
    compdef _{{ident .Prog}} {{.Prog}}
fi
`

const fishCompletion = `# fish completion for {{.Prog}}. Load it with
#   {{.Prog}} completion fish | source
# or write it to ~/.config/fish/completions/{{.Prog}}.fish.

function __{{ident .Prog}}_kubectl
    set -l kargs
    set -l words (commandline -opc)
    for i in (seq 2 (count $words))
        switch $words[$i]
            case --kubeconfig --context -n --namespace
                set -a kargs $words[$i] $words[(math $i + 1)]
            case '--kubeconfig=*' '--context=*' '--namespace=*'
                set -a kargs $words[$i]
        end
    end
    type -q kubectl; or return 0
    kubectl $kargs $argv -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' --request-timeout=5s 2>/dev/null
end

function __{{ident .Prog}}_explain_kind
    set -l words (commandline -opc)
    set -l i (contains -i -- explain $words); or return 1
    set -q words[(math $i + 1)]; or return 1
    contains -- $words[(math $i + 1)] $argv
end

complete -c {{.Prog}} -f
{{- range .Commands}}
complete -c {{$.Prog}} -n __fish_use_subcommand -a {{.Name}} -d {{quote .Help}}
{{- end}}
complete -c {{.Prog}} -n '__fish_seen_subcommand_from explain; and not __fish_seen_subcommand_from {{range .KindNames}}{{join .Aliases " "}} {{end}}' -a '{{join .Kinds " "}}'
{{- range .KindNames}}
complete -c {{$.Prog}} -n '__{{ident $.Prog}}_explain_kind {{join .Aliases " "}}' -a '(__{{ident $.Prog}}_kubectl get {{.Resource}})'
{{- end}}
complete -c {{.Prog}} -n '__fish_seen_subcommand_from completion' -a '{{join .Shells " "}}'
{{- range .Flags}}
complete -c {{$.Prog}}{{if .Short}} -s {{.Short}}{{end}} -l {{.Long}} -d {{quote .Help}}
{{- if eq .Kind "file"}} -r -F
{{- else if eq .Kind "namespace"}} -x -a '(__{{ident $.Prog}}_kubectl get namespaces)'
{{- else if eq .Kind "context"}} -x -a '(kubectl config get-contexts -o name 2>/dev/null)'
{{- else if eq .Kind "driver"}} -x -a '(__{{ident $.Prog}}_kubectl get csidrivers)'
{{- else if eq .Long "output"}} -x -a '(__fish_seen_subcommand_from explain; and printf "%s\n" {{join $.ExplainFormat " "}}; or __fish_seen_subcommand_from status; and printf "%s\n" {{join $.StatusFormat " "}}; or printf "%s\n" {{join .Values " "}})'
{{- else if .Values}} -x -a '{{join .Values " "}}'
{{- else if .TakesValue}} -x
{{- end}}
{{- end}}
`
