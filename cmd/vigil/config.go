package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/vigil-ha/vigil/internal/agent"
	"github.com/vigil-ha/vigil/internal/config"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with vigil's configuration file (--config)",
		Args:  cobra.NoArgs,
	}
	var section string
	printDefaults := &cobra.Command{
		Use:   "print-defaults",
		Short: "Print a configuration file with every setting at its default",
		Long: `Print a configuration document (apiVersion ` + config.APIVersion + `, kind
` + config.Kind + `) with every flag of vigil run (section run) and vigil agent
(section agent) at its default. Keys are the flag names in camelCase; the
flags' help explains each. Keep the settings you change and drop the rest:

  vigil config print-defaults > /etc/vigil/config.yaml
  vigil run --config /etc/vigil/config.yaml

--section run or --section agent prints that command's section alone (the
Debian packages ship /etc/vigil/config.yaml and /etc/vigil/agent.yaml so).

Flags on the command line override the file, and so do these environment
variables, for the settings that differ per node:
` + envHelp(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sections := map[config.Section]*pflag.FlagSet{
				config.SectionRun:   newRunCmd().Flags(),
				config.SectionAgent: agent.Command("agent").Flags(),
			}
			switch config.Section(section) {
			case "":
			case config.SectionRun, config.SectionAgent:
				sections = map[config.Section]*pflag.FlagSet{config.Section(section): sections[config.Section(section)]}
			default:
				return fmt.Errorf("--section %q: want %q, %q, or nothing for both", section, config.SectionRun, config.SectionAgent)
			}
			doc := config.Defaults(sections)
			b, err := yaml.Marshal(doc)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "# vigil configuration: every setting at its default (vigil config print-defaults)\n%s", b)
			return err
		},
	}
	printDefaults.Flags().StringVar(&section, "section", "", "print only this command's section: run or agent (default both)")
	cmd.AddCommand(printDefaults, newConfigPrintEnvCmd())
	return cmd
}

func newConfigPrintEnvCmd() *cobra.Command {
	var section string
	cmd := &cobra.Command{
		Use:   "print-env --section run|agent",
		Short: "Print an environment file with the per-node VIGIL_* variables, commented out",
		Long: `Print an environment file for systemd's EnvironmentFile= (the Debian
packages ship it as /etc/default/vigil and /etc/default/vigil-agent): every
VIGIL_* variable the section's command reads, commented out. Each sets the
flag of the same name and overrides the configuration file; lists are
comma-separated.

  vigil config print-env --section run > /etc/default/vigil`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var unit, command, file string
			switch config.Section(section) {
			case config.SectionRun:
				unit, command, file = "vigil.service", "vigil run", "/etc/vigil/config.yaml"
			case config.SectionAgent:
				unit, command, file = "vigil-agent.service", "vigil-agent", "/etc/vigil/agent.yaml"
			default:
				return fmt.Errorf("--section %q: want %q or %q", section, config.SectionRun, config.SectionAgent)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "# Per-node settings for %s. Each VIGIL_* variable sets the flag of\n", unit)
			fmt.Fprintf(w, "# the same name (VIGIL_ETCD_ENDPOINTS: --etcd-endpoints; lists comma-separated)\n")
			fmt.Fprintf(w, "# and overrides %s. `%s --help` explains each.\n", file, command)
			for _, flag := range config.Env[config.Section(section)] {
				if _, err := fmt.Fprintf(w, "#%s=\n", config.EnvName(flag)); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&section, "section", "", "run (vigil run's variables) or agent (vigil-agent's); required")
	return cmd
}

func envHelp() string {
	s := ""
	for _, sec := range []config.Section{config.SectionRun, config.SectionAgent} {
		s += fmt.Sprintf("\n  vigil %s:", sec)
		for i, f := range config.Env[sec] {
			if i%3 == 0 {
				s += "\n   "
			}
			s += " " + config.EnvName(f)
		}
	}
	return s
}
