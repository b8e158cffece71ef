package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// kubectl (1.26 and later) completes a plugin's arguments by running the
// executable kubectl_complete-<plugin> from PATH with the words after the
// plugin's name, the last one being the word under the cursor ("" for a
// new word), and reads one completion per line, "word" or
// "word<TAB>description", then optionally ":<directive>" as the last line:
// Cobra's __complete protocol (k8s.io/kubectl/pkg/cmd/plugin). latchctl
// answers it when it runs under that name (make build installs
// bin/kubectl_complete-latch, a copy of latchctl) and as
// `latchctl __complete WORD...`.

const (
	// completeCommand is Cobra's hidden completion command.
	completeCommand = "__complete"
	// completerPrefix starts the name kubectl looks a plugin's completer
	// up by (kubectl_complete-latch for kubectl-latch).
	completerPrefix = "kubectl_complete-"
)

// Cobra's ShellCompDirective values that latchctl uses.
const (
	// directiveDefault lets the shell complete file names.
	directiveDefault = 0
	// directiveNoFileComp: only the completions given, no file names.
	directiveNoFileComp = 4
)

// completionRequest reports whether latchctl runs as kubectl's plugin
// completer (argv0 kubectl_complete-…) or was asked `__complete …`, and
// the words to complete.
func completionRequest(argv0 string, args []string) ([]string, bool) {
	base := argv0[strings.LastIndexAny(argv0, `/\`)+1:]
	if strings.HasPrefix(strings.TrimSuffix(base, ".exe"), completerPrefix) {
		return args, true
	}
	if len(args) > 0 && args[0] == completeCommand {
		return args[1:], true
	}
	return nil, false
}

// namesFunc lists the names of one resource (namespaces, pods,
// persistentvolumeclaims, persistentvolumes, volumeattachments,
// csidrivers, or contexts: the kubeconfig's) for the cluster and
// namespace the command line so far selects; nil when it cannot.
type namesFunc func(ctx context.Context, kc KubeConfig, resource string) []string

// writeCompletions answers one completion request in Cobra's format.
func writeCompletions(ctx context.Context, w io.Writer, words []string, names namesFunc) error {
	comps, directive := complete(ctx, words, names)
	var b strings.Builder
	for _, c := range comps {
		b.WriteString(c + "\n")
	}
	fmt.Fprintf(&b, ":%d\n", directive)
	_, err := io.WriteString(w, b.String())
	return err
}

// complete returns the completions of the last word of words, as the
// scripts of `latchctl completion` do: commands, explain's kinds and the
// names of a kind's objects, completion's shells, flags and their values.
func complete(ctx context.Context, words []string, names namesFunc) ([]string, int) {
	if len(words) == 0 {
		words = []string{""}
	}
	cur, before := words[len(words)-1], words[:len(words)-1]
	d := newCompletionData("latchctl")
	flags := map[string]completionFlag{}
	for _, f := range d.Flags {
		flags["--"+f.Long] = f
		if f.Short != "" {
			flags["-"+f.Short] = f
		}
	}
	// The command and its arguments: the words that are neither flags
	// nor flag values; and the cluster the command line selects.
	var kc KubeConfig
	cmd, args := "", []string(nil)
	for i := 0; i < len(before); i++ {
		w := before[i]
		name, value, inline := strings.Cut(w, "=")
		f, isFlag := flags[name]
		switch {
		case isFlag && f.TakesValue() && !inline:
			if i+1 < len(before) {
				value = before[i+1]
			}
			i++
		case strings.HasPrefix(w, "-"):
		case cmd == "":
			cmd = w
			continue
		default:
			args = append(args, w)
			continue
		}
		switch f.Long {
		case "kubeconfig":
			kc.Kubeconfig = value
		case "context":
			kc.Context = value
		case "namespace":
			kc.Namespace = value
		}
	}
	// A flag's value: the word after it, or after "--flag=".
	if len(before) > 0 {
		if f, ok := flags[before[len(before)-1]]; ok && f.TakesValue() {
			return flagValues(ctx, f, cmd, kc, "", cur, names)
		}
	}
	if name, value, ok := strings.Cut(cur, "="); ok && strings.HasPrefix(cur, "--") {
		if f, known := flags[name]; known && f.TakesValue() {
			return flagValues(ctx, f, cmd, kc, name+"=", value, names)
		}
	}
	if strings.HasPrefix(cur, "-") {
		var out []string
		for _, f := range d.Flags {
			out = append(out, "--"+f.Long+"\t"+f.Help)
			if f.Short != "" {
				out = append(out, "-"+f.Short+"\t"+f.Help)
			}
		}
		return matching(out, "", cur), directiveNoFileComp
	}
	var out []string
	switch cmd {
	case "":
		for _, c := range d.Commands {
			out = append(out, c.Name+"\t"+c.Help)
		}
		out = append(out, "help\tshow the usage")
	case "explain":
		switch len(args) {
		case 0:
			out = d.Kinds
		case 1:
			for _, k := range d.KindNames {
				if slices.Contains(k.Aliases, strings.ToLower(args[0])) {
					out = names(ctx, kc, k.Resource)
				}
			}
		}
	case "completion":
		if len(args) == 0 {
			out = d.Shells
		}
	}
	return matching(out, "", cur), directiveNoFileComp
}

// flagValues completes the value of flag f (prefix: "--flag=" when the
// value is in the same word).
func flagValues(ctx context.Context, f completionFlag, cmd string, kc KubeConfig, prefix, cur string, names namesFunc) ([]string, int) {
	var values []string
	switch {
	case f.Kind == "file":
		return nil, directiveDefault
	case f.Kind == "namespace":
		values = names(ctx, kc, "namespaces")
	case f.Kind == "context":
		values = names(ctx, kc, "contexts")
	case f.Kind == "driver":
		values = names(ctx, kc, "csidrivers")
	case f.Long == "output" && cmd == "explain":
		values = newCompletionData("latchctl").ExplainFormat
	case f.Long == "output" && cmd == "status":
		values = newCompletionData("latchctl").StatusFormat
	default:
		values = f.Values
	}
	return matching(values, prefix, cur), directiveNoFileComp
}

// matching returns prefix+c for each candidate c (its word before a tab)
// that starts with cur.
func matching(candidates []string, prefix, cur string) []string {
	var out []string
	for _, c := range candidates {
		if word, _, _ := strings.Cut(c, "\t"); strings.HasPrefix(word, cur) {
			out = append(out, prefix+c)
		}
	}
	return out
}

// completionTimeout bounds the API requests of one completion: a shell
// waits for it.
const completionTimeout = 5 * time.Second

// apiNames is the namesFunc of the real command: the kubeconfig's
// contexts, or a list from the API server (namespaced kinds in -n's
// namespace, else the context's).
func apiNames(ctx context.Context, kc KubeConfig, resource string) []string {
	if resource == "contexts" {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kc.Kubeconfig
		raw, err := rules.Load()
		if err != nil {
			return nil
		}
		var out []string
		for name := range raw.Contexts {
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}
	client, namespace, err := newClient(kc, completionTimeout)
	if err != nil {
		return nil
	}
	if kc.Namespace != "" {
		namespace = kc.Namespace
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	var out []string
	opts := metav1.ListOptions{}
	switch resource {
	case "namespaces":
		l, err := client.CoreV1().Namespaces().List(ctx, opts)
		if err == nil {
			for _, o := range l.Items {
				out = append(out, o.Name)
			}
		}
	case "pods":
		l, err := client.CoreV1().Pods(namespace).List(ctx, opts)
		if err == nil {
			for _, o := range l.Items {
				out = append(out, o.Name)
			}
		}
	case "persistentvolumeclaims":
		l, err := client.CoreV1().PersistentVolumeClaims(namespace).List(ctx, opts)
		if err == nil {
			for _, o := range l.Items {
				out = append(out, o.Name)
			}
		}
	case "persistentvolumes":
		l, err := client.CoreV1().PersistentVolumes().List(ctx, opts)
		if err == nil {
			for _, o := range l.Items {
				out = append(out, o.Name)
			}
		}
	case "volumeattachments":
		l, err := client.StorageV1().VolumeAttachments().List(ctx, opts)
		if err == nil {
			for _, o := range l.Items {
				out = append(out, o.Name)
			}
		}
	case "csidrivers":
		l, err := client.StorageV1().CSIDrivers().List(ctx, opts)
		if err == nil {
			for _, o := range l.Items {
				out = append(out, o.Name)
			}
		}
	}
	return out
}
