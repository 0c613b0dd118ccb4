// Package config reads vigil's configuration file and environment into
// the flags of vigil run and vigil agent, so every setting has one name,
// one default and one help text: the flag's.
//
// The file is one versioned YAML document with a section per command:
//
//	apiVersion: vigil.dev/v1alpha1
//	kind: VigilConfiguration
//	run:            # vigil run
//	  vip: 10.0.0.100/24
//	  etcdEndpoints: [https://10.0.0.11:2379]
//	agent:          # vigil agent and vigil-agent
//	  server: https://10.0.0.100:6443
//
// A key is its flag's name in camelCase (--etcd-endpoints: etcdEndpoints),
// with the flag's type: a string, a number, true or false, a duration as a
// string ("2s"), a list for a flag that takes several values. An unknown
// key, apiVersion or kind is an error, naming the file and the key; each
// command checks its own section.
//
// Precedence, highest first: the command line, VIGIL_* environment
// variables (Env lists them), the file, the flag's default.
package config

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vigil-ha/vigil/internal/validate"
	"sigs.k8s.io/yaml"
)

const (
	// APIVersion and Kind identify the document.
	APIVersion = "vigil.dev/v1alpha1"
	Kind       = "VigilConfiguration"

	// FlagName is the flag that names the file.
	FlagName = "config"
)

// validate.ErrInvalid marks a configuration file or variable that cannot be used.

// Document is the file's top level. Sections hold flag values by their
// camelCase names.
type Document struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Run        map[string]any `json:"run,omitempty"`
	Agent      map[string]any `json:"agent,omitempty"`
}

// Section names a command's part of the document.
type Section string

const (
	SectionRun   Section = "run"
	SectionAgent Section = "agent"
)

func (d *Document) section(s Section) map[string]any {
	if s == SectionAgent {
		return d.Agent
	}
	return d.Run
}

// Env lists, per section, the flags that VIGIL_* environment variables may
// set: the ones a static pod or a systemd unit fills in per node. The
// variable's name is VIGIL_ and the flag's name in upper case with
// underscores (--etcd-endpoints: VIGIL_ETCD_ENDPOINTS). A list is given
// comma-separated.
var Env = map[Section][]string{
	SectionRun: {"node-name", "vip", "interface", "election", "kubeconfig",
		"etcd-endpoints", "etcd-cacert", "etcd-cert", "etcd-key",
		"lb-port", "backend-port", "metrics-address", "log-level", "log-format"},
	SectionAgent: {"server", "kubeconfig", "etcd-endpoints", "etcd-cacert", "etcd-cert", "etcd-key",
		"backend-port", "metrics-address", "log-level", "log-format"},
}

// EnvName is the environment variable for flag name.
func EnvName(flag string) string {
	return "VIGIL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Key is the file's key for flag name: its camelCase form.
func Key(flag string) string {
	var b strings.Builder
	up := false
	for _, r := range flag {
		switch {
		case r == '-':
			up = true
		case up:
			b.WriteRune(unicode.ToUpper(r))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// AddFlag adds --config to fs.
func AddFlag(fs *pflag.FlagSet, command string) *string {
	return fs.String(FlagName, "", fmt.Sprintf("read settings from this YAML file (apiVersion %s, kind %s, section %q; `vigil config print-defaults` prints one); flags and VIGIL_* variables override it", APIVersion, Kind, command))
}

// Apply sets fs's flags that the command line left alone: first from the
// environment (getenv, normally os.Getenv), then from the file that
// --config names, if any. Only section s is read and checked: the other
// belongs to the other command, which checks it. Nothing is set when an
// error is returned.
func Apply(fs *pflag.FlagSet, s Section, getenv func(string) string) error {
	type setting struct{ flag, value, from string }
	var todo []setting
	seen := map[string]bool{}
	for _, name := range Env[s] {
		env := EnvName(name)
		v := getenv(env)
		if v == "" || fs.Changed(name) {
			continue
		}
		if fs.Lookup(name) == nil {
			return fmt.Errorf("%w: %s: no flag --%s", validate.ErrInvalid, env, name) // a mistake in Env
		}
		todo = append(todo, setting{name, v, env})
		seen[name] = true
	}
	var sliceSets []func() error
	if f := fs.Lookup(FlagName); f != nil && f.Value.String() != "" {
		path := f.Value.String()
		doc, err := Read(path)
		if err != nil {
			return err
		}
		sect := doc.section(s)
		if err := check(sect, fs, path, s); err != nil {
			return err
		}
		for _, key := range slices.Sorted(mapsKeys(sect)) {
			name := flagName(key)
			fl := fs.Lookup(name)
			if fs.Changed(name) || seen[name] {
				continue
			}
			from := fmt.Sprintf("%s: %s.%s", path, s, key)
			if sv, ok := fl.Value.(pflag.SliceValue); ok {
				list, err := stringList(sect[key])
				if err != nil {
					return fmt.Errorf("%w: %s: %w", validate.ErrInvalid, from, err)
				}
				// Set below, after every other value has been checked.
				sliceSets = append(sliceSets, func() error {
					if err := sv.Replace(list); err != nil {
						return fmt.Errorf("%w: %s: %w", validate.ErrInvalid, from, err)
					}
					fl.Changed = true
					return nil
				})
				continue
			}
			v, err := scalar(sect[key])
			if err != nil {
				return fmt.Errorf("%w: %s: %w", validate.ErrInvalid, from, err)
			}
			todo = append(todo, setting{name, v, from})
		}
	}
	// Check every value before setting any, so an error leaves the flags
	// as the command line set them.
	for _, st := range todo {
		if err := validValue(fs.Lookup(st.flag), st.value); err != nil {
			return fmt.Errorf("%w: %s: --%s %q: %w", validate.ErrInvalid, st.from, st.flag, st.value, err)
		}
	}
	for _, st := range todo {
		if err := fs.Set(st.flag, st.value); err != nil {
			return fmt.Errorf("%w: %s: --%s %q: %w", validate.ErrInvalid, st.from, st.flag, st.value, err)
		}
	}
	for _, set := range sliceSets {
		if err := set(); err != nil {
			return err
		}
	}
	return nil
}

// Read reads and checks a configuration file's envelope.
func Read(path string) (*Document, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --%s: %w", validate.ErrInvalid, FlagName, err)
	}
	var doc Document
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", validate.ErrInvalid, path, err)
	}
	if doc.APIVersion != APIVersion || doc.Kind != Kind {
		return nil, fmt.Errorf("%w: %s: apiVersion %q, kind %q: want apiVersion %s, kind %s", validate.ErrInvalid, path, doc.APIVersion, doc.Kind, APIVersion, Kind)
	}
	return &doc, nil
}

// check refuses keys that are no flag of fs, and the --config key itself.
func check(sect map[string]any, fs *pflag.FlagSet, path string, s Section) error {
	for _, key := range slices.Sorted(mapsKeys(sect)) {
		name := flagName(key)
		if f := fs.Lookup(name); f == nil || name == FlagName || name == "help" || f.Hidden || Key(name) != key {
			return fmt.Errorf("%w: %s: unknown key %s.%s (keys are flag names in camelCase, such as %s; `vigil config print-defaults` lists them)", validate.ErrInvalid, path, s, key, Key(firstFlag(fs)))
		}
	}
	return nil
}

func firstFlag(fs *pflag.FlagSet) string {
	name := ""
	fs.VisitAll(func(f *pflag.Flag) {
		if name == "" && f.Name != FlagName {
			name = f.Name
		}
	})
	return name
}

// flagName turns a camelCase key back into a flag name.
func flagName(key string) string {
	var b strings.Builder
	for _, r := range key {
		if unicode.IsUpper(r) {
			b.WriteByte('-')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// validValue sets value on a scratch copy of f's type to see whether it
// parses.
func validValue(f *pflag.Flag, value string) error {
	scratch := pflag.NewFlagSet("check", pflag.ContinueOnError)
	switch f.Value.Type() {
	case "string":
		return nil
	case "int":
		scratch.Int("x", 0, "")
	case "bool":
		scratch.Bool("x", false, "")
	case "duration":
		scratch.Duration("x", 0, "")
	case "stringSlice":
		scratch.StringSlice("x", nil, "")
	case "stringArray":
		scratch.StringArray("x", nil, "")
	default:
		return nil // set directly; an error there is still reported
	}
	return scratch.Set("x", value)
}

func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case float64: // JSON numbers, as sigs.k8s.io/yaml decodes them
		if x != float64(int64(x)) {
			return "", fmt.Errorf("%v: want a whole number", x)
		}
		return strconv.FormatInt(int64(x), 10), nil
	case nil:
		return "", errors.New("no value")
	}
	return "", fmt.Errorf("%v: want a single value, not a %T", v, v)
}

func stringList(v any) ([]string, error) {
	switch x := v.(type) {
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			s, err := scalar(e)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	case string:
		return []string{x}, nil
	case float64: // a single number, for a flag that took one before it took several
		s, err := scalar(x)
		return []string{s}, err
	}
	return nil, fmt.Errorf("%v: want a list", v)
}

func mapsKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Defaults is the document with every flag of each section at its
// default, typed as the file takes it.
func Defaults(sections map[Section]*pflag.FlagSet) *Document {
	doc := &Document{APIVersion: APIVersion, Kind: Kind}
	for s, fs := range sections {
		m := map[string]any{}
		fs.VisitAll(func(f *pflag.Flag) {
			if f.Name == FlagName || f.Hidden || f.Name == "help" {
				return
			}
			m[Key(f.Name)] = typed(f)
		})
		if s == SectionAgent {
			doc.Agent = m
		} else {
			doc.Run = m
		}
	}
	return doc
}

func typed(f *pflag.Flag) any {
	switch f.Value.Type() {
	case "int":
		n, _ := strconv.Atoi(f.DefValue)
		return n
	case "bool":
		return f.DefValue == "true"
	}
	if _, ok := f.Value.(pflag.SliceValue); ok {
		// DefValue is the default, "[a,b]", whatever the command line set.
		if def := strings.Trim(f.DefValue, "[]"); def != "" {
			return strings.Split(def, ",")
		}
		return []string{}
	}
	return f.DefValue
}

// FlagNames is msg with every setting it names written as the flag that
// sets it in cmd or one of its subcommands: `leaseDuration` becomes
// --lease-duration. Libraries name settings by their keys in the file, in
// backquotes, and never by a command's flags (the errors of
// validate.ErrInvalid); the command that reports them maps them here, once.
// A backquoted word that is no flag's key is left as it is.
func FlagNames(msg string, cmd *cobra.Command) string {
	if !strings.Contains(msg, "`") {
		return msg
	}
	flags := map[string]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { flags[Key(f.Name)] = "--" + f.Name })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.Root())
	return settingRef.ReplaceAllStringFunc(msg, func(ref string) string {
		if f, ok := flags[strings.Trim(ref, "`")]; ok {
			return f
		}
		return ref
	})
}

// settingRef is a setting named in a message: a key in backquotes.
var settingRef = regexp.MustCompile("`[a-z][A-Za-z0-9]*`")
