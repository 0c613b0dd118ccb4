package lab

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// DrillPrometheus runs a real Prometheus (Debian's package) in the client
// namespace that scrapes every vigil with the alerts of vigil manifest
// monitoring, and checks the alerts as an operator would see them, through
// Prometheus's HTTP API:
//  1. kill-leader under it: the VIP-holder series (vigil_vip_held) moves
//     to the new holder, and VigilNoVIPHolder does not fire (a normal
//     failover is far shorter than its 15 s);
//  2. every node's etcd stopped (SIGSTOP), so that no election can succeed:
//     VigilNoVIPHolder fires; then etcd continues, one node holds the VIP
//     again, and the alert resolves.
const DrillPrometheus = "prometheus"

// PromResult is what the prometheus drill saw through Prometheus.
type PromResult struct {
	// HeldBefore and HeldAfter are the nodes whose vigil_vip_held was 1
	// before kill-leader and after it.
	HeldBefore string `json:"heldBefore"`
	HeldAfter  string `json:"heldAfter"`
	// PendingOnFailover is set when VigilNoVIPHolder went pending during
	// the failover (a scrape saw no holder); FiredOnFailover when it fired,
	// which fails the drill.
	PendingOnFailover bool `json:"pendingOnFailover"`
	FiredOnFailover   bool `json:"firedOnFailover"`
	// FiredAfterMillis is from stopping every etcd to the alert firing.
	FiredAfterMillis float64 `json:"firedAfterMillis"`
	// ResolvedAfterMillis is from etcd continuing to the alert resolved.
	ResolvedAfterMillis float64 `json:"resolvedAfterMillis"`
}

func (p PromResult) String() string {
	return fmt.Sprintf("prometheus: vigil_vip_held %s -> %s; VigilNoVIPHolder on failover: pending %s, fired %s; every etcd stopped: fired after %.1f s, resolved %.1f s after etcd continued",
		p.HeldBefore, p.HeldAfter, yesNo(p.PendingOnFailover), yesNo(p.FiredOnFailover), p.FiredAfterMillis/1000, p.ResolvedAfterMillis/1000)
}

const (
	promListen = "127.0.0.1:9090" // in the client namespace, the lab's own
	noHolder   = "VigilNoVIPHolder"
	// noHolderFor is the rule's for: (vigil manifest monitoring).
	noHolderFor = 15 * time.Second
)

func (l *Lab) promDrill(ctx context.Context, r *Result) error {
	if l.st.Settings.Impl != ImplVigil || l.st.Settings.Kubeadm || l.st.Settings.ecmp() {
		return fmt.Errorf("drill %s needs a vigil lab with one holder", DrillPrometheus)
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		return fmt.Errorf("drill %s needs Prometheus (Debian package prometheus; hack/deps.sh promtool installs it): %w", DrillPrometheus, err)
	}
	dir := filepath.Join(l.dir, "prometheus")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rules, err := exec.CommandContext(ctx, l.vigilBin, "manifest", "monitoring", "--rules-file").Output()
	if err != nil {
		return fmt.Errorf("vigil manifest monitoring --rules-file: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		return err
	}
	var cfg strings.Builder
	// Scraped every second, as an operator of a control plane would want
	// for an alert about seconds; the rules' own for: stand.
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nrule_files: [rules.yaml]\nscrape_configs:\n  - job_name: vigil\n    static_configs:\n")
	for _, n := range l.st.Nodes {
		fmt.Fprintf(&cfg, "      - targets: [%q]\n        labels: {node: %s}\n", l.metricsTarget(n), n.Name)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o644); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command("ip", "netns", "exec", clientNS, prom,
		"--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promListen, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	// Killed with the lab tool if it dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start prometheus: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	p := &PromResult{}
	r.Prometheus = p

	// Every vigil scraped, and one holder in the series.
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	if err := promWait(ctx, 60*time.Second, func() error {
		up, err := promQuery(ctx, "up == 1")
		if err != nil {
			return err
		}
		if len(up) != len(l.st.Nodes) {
			return fmt.Errorf("%d of %d vigils scraped", len(up), len(l.st.Nodes))
		}
		return heldBy(ctx, holder, &p.HeldBefore)
	}); err != nil {
		return fmt.Errorf("before the drill: %w (log: %s)", err, log.Name())
	}

	// 1. A normal failover.
	fault := time.Now()
	kill := l.Drill(ctx, DrillKillLeader, r.Run)
	if kill.Error != "" {
		return fmt.Errorf("kill-leader: %s", kill.Error)
	}
	r.Target, r.Before, r.After, r.OutageMillis, r.HealOutageMillis = kill.Target, kill.Before, kill.After, kill.OutageMillis, kill.HealOutageMillis
	r.SplitBrain, r.SplitDetail, r.HoldersAfterHeal = kill.SplitBrain, kill.SplitDetail, kill.HoldersAfterHeal
	if err := promWait(ctx, 30*time.Second, func() error { return heldBy(ctx, kill.After, &p.HeldAfter) }); err != nil {
		return fmt.Errorf("after kill-leader: %w", err)
	}
	// Long enough after the fault for a no-holder spell that began with
	// it to have fired, then look back over the whole window.
	if !clock.Sleep(ctx, time.Until(fault.Add(noHolderFor+5*time.Second))) {
		return ctx.Err()
	}
	window := fmt.Sprintf("%ds", int(time.Since(fault).Seconds())+2)
	for state, seen := range map[string]*bool{"pending": &p.PendingOnFailover, "firing": &p.FiredOnFailover} {
		v, err := promQuery(ctx, fmt.Sprintf(`max_over_time(ALERTS{alertname=%q,alertstate=%q}[%s])`, noHolder, state, window))
		if err != nil {
			return err
		}
		*seen = len(v) > 0
	}
	if p.FiredOnFailover {
		return fmt.Errorf("%s fired on a normal failover (outage %.0f ms)", noHolder, r.OutageMillis)
	}

	// 2. No election can succeed anywhere: the alert must fire.
	stopped := time.Now()
	var stopErr error
	for _, n := range l.st.Nodes {
		stopErr = errors.Join(stopErr, l.signal(ctx, n, roleEtcd, syscall.SIGSTOP, 0))
	}
	cont := func() error {
		var err error
		for _, n := range l.st.Nodes {
			err = errors.Join(err, l.signal(ctx, n, roleEtcd, syscall.SIGCONT, 0))
		}
		return err
	}
	if stopErr != nil {
		return errors.Join(stopErr, cont())
	}
	err = promWait(ctx, noHolderFor+45*time.Second, func() error {
		v, err := promQuery(ctx, fmt.Sprintf(`ALERTS{alertname=%q,alertstate="firing"}`, noHolder))
		if err == nil && len(v) == 0 {
			err = fmt.Errorf("%s is not firing", noHolder)
		}
		return err
	})
	p.FiredAfterMillis = millis(time.Since(stopped))
	continued := time.Now()
	if err := errors.Join(err, cont()); err != nil {
		return fmt.Errorf("with every etcd stopped: %w", err)
	}
	if _, err := l.waitStable(ctx, recoverTimeout); err != nil {
		return fmt.Errorf("no single holder after etcd continued: %w", err)
	}
	if err := promWait(ctx, 30*time.Second, func() error {
		v, err := promQuery(ctx, fmt.Sprintf(`ALERTS{alertname=%q}`, noHolder))
		if err == nil && len(v) > 0 {
			err = fmt.Errorf("%s still %s", noHolder, v[0].Metric["alertstate"])
		}
		return err
	}); err != nil {
		return fmt.Errorf("after etcd continued: %w", err)
	}
	p.ResolvedAfterMillis = millis(time.Since(continued))
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	defer w.close()
	r.HoldersAfterHeal, err = w.holders(l.st.Nodes)
	return err
}

// metricsTarget is where Prometheus scrapes node's vigil: its address on
// the lab's switch (vigil runs with --metrics-address on every address).
func (l *Lab) metricsTarget(n *Node) string {
	if n.IP.Is6() {
		return fmt.Sprintf("[%s]:%d", n.IP, labMetricsPort)
	}
	return fmt.Sprintf("%s:%d", n.IP, labMetricsPort)
}

// heldBy checks that node alone has vigil_vip_held 1, and names it in *got.
func heldBy(ctx context.Context, node string, got *string) error {
	v, err := promQuery(ctx, "vigil_vip_held == 1")
	if err != nil {
		return err
	}
	var nodes []string
	for _, s := range v {
		nodes = append(nodes, s.Metric["node"])
	}
	*got = strings.Join(nodes, ",")
	if len(nodes) != 1 || nodes[0] != node {
		return fmt.Errorf("vigil_vip_held is 1 on %q, want %s", nodes, node)
	}
	return nil
}

type promSample struct {
	Metric map[string]string `json:"metric"`
}

// promQuery runs an instant query through Prometheus's HTTP API.
func promQuery(ctx context.Context, q string) ([]promSample, error) {
	var resp struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(ctx, clientNS, "http://"+promListen+"/api/v1/query?query="+url.QueryEscape(q), &resp); err != nil {
		return nil, err
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, resp.Error)
	}
	return resp.Data.Result, nil
}

// promWait retries check every 500 ms until it passes or d is up.
func promWait(ctx context.Context, d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		if !clock.Sleep(ctx, 500*time.Millisecond) {
			return errors.Join(err, ctx.Err())
		}
	}
}
