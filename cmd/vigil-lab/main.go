// Command vigil-lab builds a vigil control plane in network namespaces on one
// machine, breaks it on purpose and measures what clients of the VIP see.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/lab"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "vigil-lab:", err)
		stop()
		os.Exit(1)
	}
}

// globals are the flags every subcommand shares.
type globals struct {
	dir      string
	vigilBin string
	verbose  bool
	instance string
}

// setInstance makes --instance (or, without it, $VIGIL_LAB_INSTANCE) the
// lab instance, for this process and the ones it starts, and gives each
// instance its own default --dir.
func (g *globals) setInstance(cmd *cobra.Command) error {
	if cmd.Flags().Changed("instance") {
		if err := lab.SetInstance(g.instance); err != nil {
			return err
		}
		if err := os.Setenv(lab.InstanceEnv, g.instance); err != nil {
			return err
		}
	} else if err := lab.SetInstance(os.Getenv(lab.InstanceEnv)); err != nil {
		return err
	}
	if in := lab.Instance(); in != "" && !cmd.Flags().Changed("dir") {
		g.dir = lab.DefaultDir + "-" + in
	}
	return nil
}

func (g *globals) open() (*lab.Lab, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	bin := g.vigilBin
	if bin == "" {
		bin = filepath.Join(filepath.Dir(self), "vigil")
	}
	return lab.New(lab.Config{Dir: g.dir, VigilBin: bin, SelfBin: self, Progress: os.Stderr}, log)
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "vigil-lab",
		Short: "A vigil control plane in network namespaces, with failure drills",
		Long: `vigil-lab builds a small control plane on this machine: a bridge, a client
namespace and one namespace per node running a real etcd member, "vigil run"
and a UDP responder. Drills break it (kill, stop or cut off the VIP holder, kill
the etcd raft leader) while the client probes the VIP every 10 ms, and report the
outage and any split brain. Needs root and iproute2.

Quick start:  vigil-lab demo`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.setInstance(cmd)
		},
	}
	root.PersistentFlags().StringVar(&g.dir, "dir", lab.DefaultDir, "state, data and logs of the lab (with --instance NAME: "+lab.DefaultDir+"-NAME)")
	root.PersistentFlags().StringVar(&g.instance, "instance", "", "run a separate lab beside the default one: its namespaces are vlabNAME-* instead of vlab-*, with the same addresses inside (1-8 lowercase letters and digits; default $"+lab.InstanceEnv+"). Netns labs only: the kubeadm lab is one at a time. down removes only its own instance")
	root.PersistentFlags().StringVar(&g.vigilBin, "vigil-bin", "", "vigil binary to run on the nodes (default: vigil next to vigil-lab)")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log what the lab does")
	root.AddCommand(newUpCmd(g), newDownCmd(g), newStatusCmd(g), newDrillCmd(g), newDemoCmd(g), newChaosCmd(g), newBenchLBCmd(g), newEtcdCmd(), newResponderCmd(), newWorkerClientCmd(), newAPIServerCmd(), newLoadgenCmd(), newStormCmd(), newGrayCmd(g), newEtcdFrontCmd(), newRouterFIBCmd())
	return root
}
