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
	cmd.AddCommand(printDefaults)
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
