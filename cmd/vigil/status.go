package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/daemon"
)

func newStatusCmd() *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what the local vigil run sees: who leads, since when, the API server backends",
		Long: `Ask the vigil run on this node (its --metrics-address, 127.0.0.1:9558 by
default) for its view: this node, the VIP, the current holder, since when this
node leads (if it does), whether it yields the VIP because its own API server
fails, and every API server backend with its health and connections.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, raw, err := fetchStatus(addr)
			if err != nil {
				return err
			}
			if asJSON {
				_, err := cmd.OutOrStdout().Write(raw)
				return err
			}
			return printReport(cmd.OutOrStdout(), r, time.Now())
		},
	}
	cmd.Flags().StringVar(&addr, "address", "127.0.0.1:9558", "the --metrics-address of the local vigil run")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the JSON as vigil run serves it")
	return cmd
}

func fetchStatus(addr string) (daemon.Report, []byte, error) {
	var r daemon.Report
	hc := &http.Client{Timeout: 3 * time.Second}
	resp, err := hc.Get("http://" + addr + "/status")
	if err != nil {
		return r, nil, fmt.Errorf("no vigil run answers on %s (is it running, with this --metrics-address?): %w", addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return r, nil, fmt.Errorf("read %s/status: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return r, nil, fmt.Errorf("%s/status: HTTP %d", addr, resp.StatusCode)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, nil, fmt.Errorf("%s/status is not vigil's status: %w", addr, err)
	}
	return r, raw, nil
}

func printReport(w io.Writer, r daemon.Report, now time.Time) error {
	holder := r.Holder
	if holder == "" {
		holder = "(none)"
	}
	if r.HolderMAC != "" {
		holder += " (" + r.HolderMAC + ")"
	}
	fmt.Fprintf(w, "node %s  vip %s  holder %s\n", r.Node, r.VIP, holder)
	switch {
	case r.Leader && r.LeaderSince != nil:
		fmt.Fprintf(w, "this node leads since %s (%s)\n", r.LeaderSince.Format(time.RFC3339), now.Sub(*r.LeaderSince).Round(time.Second))
	case r.Yielding:
		fmt.Fprintln(w, "this node yields the VIP: its own API server fails its checks")
	case r.Ineligible != "":
		fmt.Fprintf(w, "this node does not campaign: %s\n", r.Ineligible)
	default:
		fmt.Fprintln(w, "this node does not lead")
	}
	if rn := r.Renewal; rn != nil {
		fmt.Fprintf(w, "renewals: answered in %.0fms, %.0fms of the %.0fms renew deadline left (least in 10s: %.0fms)\n",
			rn.LatencyMillis, rn.MarginMillis, rn.RenewDeadlineMillis, rn.MinMarginMillis)
		if rn.AtRisk != "" {
			fmt.Fprintf(w, "LEASE AT RISK: %s\n", rn.AtRisk)
		}
	}
	switch c := r.Conflict; {
	case len(c.MACs) > 0 && c.Since != nil:
		fmt.Fprintf(w, "VIP CONFLICT: %s answer(s) for the VIP besides the holder, since %s (%s); %d conflicts since start\n",
			strings.Join(c.MACs, ", "), c.Since.Format(time.RFC3339), now.Sub(*c.Since).Round(time.Second), c.Total)
	case c.LastError != "":
		fmt.Fprintf(w, "VIP conflict check failing: %s; %d conflicts since start\n", c.LastError, c.Total)
	case c.LastProbe != nil:
		fmt.Fprintf(w, "VIP conflicts: none now (checked %s ago); %d since start\n", now.Sub(*c.LastProbe).Round(time.Second), c.Total)
	}
	if e := r.Etcd; e != nil {
		id := e.ClusterID
		if id == "" {
			id = "not known yet (a majority of the endpoints has not answered)"
		}
		fmt.Fprintf(w, "etcd cluster %s\n", id)
		for _, f := range e.Foreign {
			fmt.Fprintf(w, "ETCD IMPOSTOR: %s answers for cluster %s (%d answers refused, the last %s ago)\n",
				f.Endpoint, f.ClusterID, f.Answers, now.Sub(f.Last).Round(time.Second))
		}
	}
	if c := r.Conflict; c.Untracked > 0 {
		fmt.Fprintf(w, "VIP conflict: %d more hardware addresses answered than are tracked (a flood of ARP or NDP replies?)\n", c.Untracked)
	}
	for _, p := range r.BGP {
		adv := ""
		if p.Established && r.Advertised {
			adv = ", advertising the VIP"
		}
		if p.BFD != "" {
			adv = ", BFD " + p.BFD + adv
		}
		fmt.Fprintf(w, "bgp: peer %s %s%s\n", p.Peer, p.State, adv)
	}
	if r.ECMP != "" {
		adv := "not advertising the VIP"
		if r.Advertised {
			adv = "advertising the VIP"
		}
		fmt.Fprintf(w, "bgp: ecmp mode, %s: %s\n", adv, r.ECMP)
	}
	for _, d := range r.DNAT {
		fmt.Fprintf(w, "lb: %s (nftables, while this node holds the VIP)\n", d)
	}
	if b := r.BGPSettings; b != nil {
		fmt.Fprintf(w, "bgp: hold time %s, keepalive %s", b.HoldTime, b.Keepalive)
		if b.Multihop > 0 {
			fmt.Fprintf(w, ", multihop %d", b.Multihop)
		}
		if b.SourceAddress != "" {
			fmt.Fprintf(w, ", source %s", b.SourceAddress)
		}
		if len(b.Communities) > 0 {
			fmt.Fprintf(w, ", communities %s", strings.Join(b.Communities, " "))
		}
		if b.LocalPref > 0 {
			fmt.Fprintf(w, ", local preference %d", b.LocalPref)
		}
		if b.GracefulRestart {
			fmt.Fprint(w, ", graceful restart")
		}
		if b.BFD != "" {
			fmt.Fprintf(w, ", BFD %s", b.BFD)
		}
		fmt.Fprintln(w)
	}
	for _, d := range r.Discovery {
		what := fmt.Sprintf("%d backends", len(d.Backends))
		if !d.Answered {
			what = "no answer yet"
		}
		if d.Error != "" {
			what += ", last read failed: " + d.Error
		}
		fmt.Fprintf(w, "discovery: %s: %s\n", d.Name, what)
	}
	if len(r.Backends) == 0 {
		fmt.Fprintln(w, "no API server backends known")
		return nil
	}
	if err := printBackends(w, r.Backends); err != nil {
		return err
	}
	for _, p := range r.Ports {
		fmt.Fprintf(w, "lb: VIP port %d to backend port %d, checked by %s\n", p.Port, p.BackendPort, p.Check)
		if err := printBackends(w, p.Backends); err != nil {
			return err
		}
	}
	return nil
}

func printBackends(w io.Writer, backends []daemon.BackendReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tSTATE\tCONNECTIONS\tLAST ERROR")
	for _, b := range backends {
		state := b.State
		if b.Cause != "" {
			state += " (" + b.Cause + ")"
		}
		last := b.LastError
		if last == "" {
			last = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", b.Address, state, b.Connections, last)
	}
	return tw.Flush()
}
