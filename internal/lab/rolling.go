package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// DrillRollingUpgrade upgrades the lab's vigil node by node from an
// earlier revision (vigil-lab drill rolling-upgrade --from REV; the lab's
// own vigil is the new one), while the client probes the VIP:
//  1. every node is restarted on the old vigil, one at a time, the holder
//     last (not measured: the starting point);
//  2. a node that does not hold the VIP is restarted on the new vigil: the
//     mixed state, old and new records side by side;
//  3. the holder, still old, gets SIGKILL (a crash in the mixed state) and
//     comes back on the new vigil;
//  4. every node still old is restarted on the new vigil, SIGTERM first
//     (a holder among them hands the VIP over, old to new).
//
// Each step's outage is a phase; never two holders, sampled on every node.
const DrillRollingUpgrade = "rolling-upgrade"

// mixedDwell is how long the drill stays in the mixed state before it
// kills the old holder: several renewals and reads of each version's
// records by the other.
const mixedDwell = 2 * time.Second

// stepDwell is the wait after each step, once every vigil campaigns again.
const stepDwell = 1500 * time.Millisecond

// SetUpgradeFrom sets the vigil binary the rolling-upgrade drill upgrades
// from (BuildRevision builds one).
func (l *Lab) SetUpgradeFrom(bin string) { l.upgradeFrom = bin }

var revRE = regexp.MustCompile(`^[0-9A-Za-z._/-]+$`)

// BuildRevision builds cmd/vigil of revision rev of the git repository
// repo into dir, and returns its path; a binary already built there is
// reused. The source is the commit's own tree (git archive), built with
// this machine's Go and module cache, as hack/build.sh builds it.
//
// With modules empty the revision is built against its own go.mod and
// go.sum: the binary its release shipped. With modules naming a directory
// that holds a go.mod and go.sum (this tree's, in the tests), it is built
// against those first: the revision's own code, on the module versions
// this build has compiled already, so that building it costs the
// revision's packages alone (a cold run of the tests compiled gRPC, etcd
// and the Kubernetes client again for a previous release whose go.mod
// differed by patch versions: 147 CPU-seconds, against 15 now). If the revision does not
// build so (an API it used has changed), it is built against its own.
func BuildRevision(ctx context.Context, repo, rev, dir, modules string) (string, error) {
	if !revRE.MatchString(rev) || strings.HasPrefix(rev, "-") {
		return "", fmt.Errorf("--from %q: not a git revision", rev)
	}
	out, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("--from %s: no such commit in %s (a shallow clone lacks older commits: git fetch --unshallow)", rev, repo)
	}
	commit := strings.TrimSpace(string(out))
	var mod, sum []byte
	if modules != "" {
		if mod, err = os.ReadFile(filepath.Join(modules, "go.mod")); err == nil {
			sum, err = os.ReadFile(filepath.Join(modules, "go.sum"))
		}
		if err != nil {
			return "", fmt.Errorf("build vigil at %s with the modules of %s: %w", commit, modules, err)
		}
	}
	own := filepath.Join(dir, "vigil-"+commit)
	shared := own + "-modules-" + shortHash(mod, sum)
	if modules != "" {
		if _, err := os.Stat(shared); err == nil {
			return shared, nil
		}
	}
	if _, err := os.Stat(own); err == nil {
		return own, nil
	}
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", repo, commit, src)
	if b, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %w\n%s", commit, err, b)
	}
	if modules != "" {
		// -modfile leaves the revision's own go.mod in place for the
		// fallback; go.sum is read beside the file -modfile names.
		alt := filepath.Join(src, ".vigil-modules")
		if err := os.Mkdir(alt, 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(alt, "go.mod"), mod, 0o644); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(alt, "go.sum"), sum, 0o644); err != nil {
			return "", err
		}
		if err := goBuildVigil(ctx, src, commit, shared, "-modfile="+filepath.Join(alt, "go.mod")); err == nil {
			return shared, nil
		} else if ctx.Err() != nil {
			return "", err
		}
	}
	if err := goBuildVigil(ctx, src, commit, own); err != nil {
		return "", err
	}
	return own, nil
}

// goBuildVigil builds src's cmd/vigil into bin.
func goBuildVigil(ctx context.Context, src, commit, bin string, flags ...string) error {
	// At idle CPU priority (SCHED_IDLE where chrt is there, else nice 19):
	// the tests build it beside running drills, whose timings a compile
	// at nice 10 still disturbed (a cold run's apiserver-slow).
	args := []string{"nice", "-n", "19", "go", "build", "-trimpath", "-gcflags=all=-dwarf=false",
		"-ldflags", "-w -X github.com/vigil-ha/vigil.revision=" + commit}
	args = append(args, flags...)
	args = append(args, "-o", bin+".tmp", "./cmd/vigil")
	if _, err := exec.LookPath("chrt"); err == nil {
		args = append([]string{"chrt", "--idle", "0"}, args...)
	}
	build := exec.CommandContext(ctx, args[0], args[1:]...)
	build.Dir = src
	build.Env = append(os.Environ(), "GOTOOLCHAIN=local", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build vigil at %s: %w\n%s", commit, err, b)
	}
	return os.Rename(bin+".tmp", bin)
}

// shortHash names a set of module requirements in a file name.
func shortHash(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func (l *Lab) rollingUpgrade(ctx context.Context, r *Result) error {
	s := l.st.Settings
	if s.Impl != ImplVigil || s.Kubeadm || s.ecmp() {
		return fmt.Errorf("drill %s needs a vigil lab with one holder", DrillRollingUpgrade)
	}
	if l.upgradeFrom == "" {
		return fmt.Errorf("drill %s needs the vigil to upgrade from: vigil-lab drill %s --from REV", DrillRollingUpgrade, DrillRollingUpgrade)
	}
	old := l.upgradeFrom
	// Whatever happens, the lab ends on its own vigil.
	defer func() {
		for _, n := range l.st.Nodes {
			if n.VigilBin == "" {
				continue
			}
			if pid := n.PIDs[roleVigil]; pid != 0 && alive(pid) {
				_ = l.signal(ctx, n, roleVigil, syscall.SIGTERM, 15*time.Second)
			}
			n.VigilBin = ""
			_ = l.startVigil(n)
		}
	}()
	// restart stops node's vigil with sig and starts it on bin ("": the
	// lab's), then waits for one holder and every vigil campaigning again,
	// so that the next step never stops the only candidate.
	restart := func(n *Node, bin string, sig syscall.Signal) error {
		if err := l.signal(ctx, n, roleVigil, sig, 15*time.Second); err != nil {
			return err
		}
		n.VigilBin = bin
		if err := l.startVigil(n); err != nil {
			return err
		}
		if _, err := l.waitStable(ctx, recoverTimeout); err != nil {
			return err
		}
		return l.waitCandidates(ctx, recoverTimeout)
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	byHolderLast := func(holder string) []*Node {
		ns := slices.Clone(l.st.Nodes)
		slices.SortStableFunc(ns, func(a, b *Node) int {
			switch {
			case a.Name == holder:
				return 1
			case b.Name == holder:
				return -1
			}
			return 0
		})
		return ns
	}
	// 1. Every node on the old vigil.
	for _, n := range byHolderLast(holder) {
		if err := restart(n, old, syscall.SIGTERM); err != nil {
			return fmt.Errorf("start %s on the old vigil: %w", n.Name, err)
		}
	}
	if holder, err = l.waitStable(ctx, recoverTimeout); err != nil {
		return err
	}
	r.Before = holder

	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	defer w.close()
	live := func() []*Node { return l.st.Nodes }
	mon := startMonitor(w, live, probeInterval)
	defer mon.close()
	p, err := startProber(probeInterval, s.vips()[0].Addr())
	if err != nil {
		return err
	}
	defer p.close()
	if !clock.Sleep(ctx, 300*time.Millisecond) { // baseline
		return ctx.Err()
	}
	start := time.Now()
	step := func(name string, n *Node, sig syscall.Signal) error {
		t0 := time.Now()
		if err := restart(n, "", sig); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		// As an operator waits for a node to be ready before the next:
		// two planned moves less than a second apart would read, in the
		// client's answers, like two holders taking turns (judgeSplit).
		if !clock.Sleep(ctx, stepDwell) {
			return ctx.Err()
		}
		r.Phases = append(r.Phases, Phase{Name: name, Millis: millis(longestGap(p.snapshot(), t0, time.Now()))})
		return nil
	}
	// 2. A node that does not hold the VIP: the mixed state.
	var first *Node
	for _, n := range l.st.Nodes {
		if n.Name != holder {
			first = n
			break
		}
	}
	if err := step(first.Name+" upgraded", first, syscall.SIGTERM); err != nil {
		return err
	}
	// A while in the mixed state: the old holder renews, the new node
	// reads its records and campaigns beside the old one.
	if !clock.Sleep(ctx, mixedDwell) {
		return ctx.Err()
	}
	// 3. The holder, still old, crashes in the mixed state.
	if holder, err = l.waitStable(ctx, recoverTimeout); err != nil {
		return err
	}
	h, err := l.node(holder)
	if err != nil {
		return err
	}
	r.Target = holder
	if err := step(holder+" killed, upgraded", h, syscall.SIGKILL); err != nil {
		return err
	}
	// 4. The rest, the holder among them if old, by SIGTERM.
	if holder, err = l.waitStable(ctx, recoverTimeout); err != nil {
		return err
	}
	for _, n := range byHolderLast(holder) {
		if n.VigilBin == "" {
			continue
		}
		what := n.Name + " upgraded"
		if n.Name == holder {
			what = n.Name + " upgraded (the holder)"
		}
		if err := step(what, n, syscall.SIGTERM); err != nil {
			return err
		}
	}
	if !clock.Sleep(ctx, postHealWatch) {
		return ctx.Err()
	}
	replies := p.close()
	r.SplitBrain, r.SplitDetail = judgeSplit(mon.close(), replies, start)
	r.OutageMillis = millis(longestGap(replies, start, time.Now()))
	final, err := w.holders(l.st.Nodes)
	if err != nil {
		return err
	}
	r.HoldersAfterHeal = final
	if len(final) == 1 {
		r.After = final[0]
	}
	var still []string
	for _, n := range l.st.Nodes {
		if n.VigilBin != "" {
			still = append(still, n.Name)
		}
	}
	if len(still) > 0 {
		return errors.New("still on the old vigil: " + strings.Join(still, ", "))
	}
	return nil
}
