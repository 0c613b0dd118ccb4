// Package recovery brings an etcd cluster back from the loss of its
// quorum (vigil members recover): on a surviving member, with its etcd
// stopped, it turns that member's data directory into a one-member
// cluster that keeps everything the member had committed.
//
// How: etcd's own --force-new-cluster, run once, in-process, on the data
// directory. etcd replays the member's write-ahead log, so every entry the
// member had committed is kept, including those its database had not
// written yet when it stopped (a power loss, a SIGKILL); it then commits a
// configuration change that removes every other member, and stops. The
// cluster ID, the member's ID and its peer URL stay; the data directory is
// the one etcd's static pod or unit already uses, so nothing else changes:
// the next start of etcd is a one-member cluster. The alternative,
// etcdutl snapshot restore of the member's database file, keeps only what
// the database had, which can be behind the log, and gives the cluster a
// new ID that every client following this one (vigil's identity check
// among them) would have to be told about.
//
// Of several survivors without a quorum, the one to recover is the one that
// knows the most committed (its write-ahead log's last hard state; the
// others' Status): Recover refuses on another, naming it, unless forced.
//
// Every check runs before anything is written, and a refusal leaves the
// data directory byte for byte as it was. Before the one change, the data
// directory is copied beside itself.
package recovery

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.uber.org/zap"
)

// ErrRefused wraps every refusal: nothing was changed, and the message
// says why and what to do instead.
var ErrRefused = errors.New("recovery: refused")

// Config describes a recovery.
type Config struct {
	// DataDir is the stopped member's etcd data directory.
	DataDir string
	// Name is the member's name (etcd's --name; kubeadm uses the node
	// name). It must be a member in DataDir.
	Name string
	// PeerURL, when set, must be one of the member's peer URLs: a check
	// that this is the node meant.
	PeerURL string
	// TLS is for asking the other members whether they answer (https
	// client URLs, as kubeadm's).
	TLS *tls.Config
	// DryRun checks and says what would be done, and changes nothing.
	DryRun bool
	// Force recovers although the other members that answer could still
	// make a quorum with this one, or a voter among them has committed
	// more than this member: each is said, and then overridden. The other refusals
	// stand.
	Force bool
	// Timeout bounds the one-member start (60 s when 0).
	Timeout time.Duration
	// Now names the backup (time.Now when nil).
	Now func() time.Time
}

// Member is a member as the data directory lists it.
type Member struct {
	ID         uint64   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
	// Committed is the last raft index the member knows committed: from
	// its write-ahead log for this member (its database can be behind
	// after a power loss), from its Status for one that answers.
	Committed uint64 `json:"-"`
}

func (m Member) label() string {
	if m.Name == "" {
		return fmt.Sprintf("%x (not started)", m.ID)
	}
	return fmt.Sprintf("%s (%x)", m.Name, m.ID)
}

// Result is what Recover did, or with DryRun would do.
type Result struct {
	Self Member
	// Removed are the other members, gone from the recovered cluster.
	Removed []Member
	// Answering are other members whose client URLs answered although
	// they are not enough for a quorum: they must be stopped and wiped
	// before they come back.
	Answering []Member
	// Backup is the copy of the data directory made before the change.
	Backup string
}

// lockWait is how long opening the database waits for etcd's lock: a
// running etcd holds it for as long as it runs.
const lockWait = 500 * time.Millisecond

// statusTimeout bounds each other member's answer.
const statusTimeout = 2 * time.Second

// Recover checks cfg, then makes cfg.DataDir a one-member cluster. say
// receives each step, for people.
func Recover(ctx context.Context, cfg Config, say func(format string, a ...any)) (*Result, error) {
	if say == nil {
		say = func(string, ...any) {}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: the member's name is required (etcd's --name; kubeadm names members after their nodes)", ErrRefused)
	}
	db := filepath.Join(cfg.DataDir, "member", "snap", "db")
	if st, err := os.Stat(filepath.Join(cfg.DataDir, "member", "wal")); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: %s is not an etcd data directory (no member/wal in it)", ErrRefused, cfg.DataDir)
	}
	if _, err := os.Stat(db); err != nil {
		return nil, fmt.Errorf("%w: %s is not an etcd data directory (no member/snap/db in it)", ErrRefused, cfg.DataDir)
	}
	running := false
	members, applied, err := readMembers(db)
	if errors.Is(err, errRunning) && cfg.DryRun {
		// A dry run may look while etcd runs (a kubeadm node's kubelet
		// keeps it running without quorum): from a copy of its database.
		running = true
		members, applied, err = readMembersOfCopy(db)
	}
	if err != nil {
		return nil, err
	}
	r := &Result{}
	i := slices.IndexFunc(members, func(m Member) bool { return m.Name == cfg.Name })
	if i < 0 {
		var names []string
		for _, m := range members {
			names = append(names, m.label())
		}
		return nil, fmt.Errorf("%w: no member named %q in %s; its members: %s", ErrRefused, cfg.Name, cfg.DataDir, strings.Join(names, ", "))
	}
	r.Self = members[i]
	r.Self.Committed = applied
	if c, err := walCommit(cfg.DataDir); err == nil {
		r.Self.Committed = max(c, applied)
	} else {
		say("cannot read the commit index from %s's write-ahead log (%v); comparing by what its database applied", cfg.DataDir, err)
	}
	if r.Self.IsLearner {
		return nil, fmt.Errorf("%w: %s is a learner: it may lack committed entries; recover from a voter's data directory", ErrRefused, r.Self.label())
	}
	if cfg.PeerURL != "" && !slices.Contains(r.Self.PeerURLs, cfg.PeerURL) {
		return nil, fmt.Errorf("%w: %s advertises peer URLs %s, not %s: is this the node you meant?", ErrRefused, r.Self.label(), strings.Join(r.Self.PeerURLs, ","), cfg.PeerURL)
	}
	voters := 0
	var others []Member
	for _, m := range members {
		if !m.IsLearner {
			voters++
		}
		if m.ID != r.Self.ID {
			others = append(others, m)
		}
	}
	r.Removed = others
	if running {
		say("%s is member %s of %d (%d voters); its etcd is running: read from a copy of its database (the real run needs it stopped; --kubeadm stops it)", cfg.DataDir, r.Self.label(), len(members), voters)
	} else {
		say("%s is member %s of %d (%d voters); its etcd is stopped", cfg.DataDir, r.Self.label(), len(members), voters)
	}
	answering := answers(ctx, others, cfg.TLS)
	votersAnswering := 0
	for _, m := range answering {
		if !m.IsLearner {
			votersAnswering++
		}
	}
	if quorum := voters/2 + 1; votersAnswering+1 >= quorum {
		var names []string
		for _, m := range answering {
			names = append(names, m.label())
		}
		if !cfg.Force {
			return nil, fmt.Errorf("%w: the cluster has not lost its quorum: %s answer, and with this member's etcd started again %d of %d voters would (%d needed); start it again, and change membership with vigil members remove or replace instead",
				ErrRefused, strings.Join(names, ", "), votersAnswering+1, voters, quorum)
		}
		say("warning (--force): %s answer, and with this member %d of %d voters could make a quorum; recovering anyway: stop and wipe them now, or two clusters will share one ID", strings.Join(names, ", "), votersAnswering+1, voters)
	}
	// Of several survivors, recover the one that knows the most committed:
	// the others' extra entries would be lost with them.
	if best := mostAdvanced(answering); best != nil && best.Committed > r.Self.Committed {
		if !cfg.Force {
			return nil, fmt.Errorf("%w: %s is further ahead than %s (raft index %d committed, this member %d): recover on it instead (stop its etcd first), and wipe this member; `force` recovers here and loses what only it has",
				ErrRefused, best.label(), r.Self.label(), best.Committed, r.Self.Committed)
		}
		say("warning (--force): %s is further ahead (raft index %d committed, this member %d); recovering here anyway loses what only it has", best.label(), best.Committed, r.Self.Committed)
	}
	r.Answering = answering
	say("%s has raft index %d committed", r.Self.label(), r.Self.Committed)
	for _, m := range answering {
		say("warning: %s answers (raft index %d committed), but is not enough for a quorum: stop it and wipe its data directory before it comes back, or it will try to rejoin a cluster that removed it", m.label(), m.Committed)
	}
	backup := fmt.Sprintf("%s.vigil-backup-%s", strings.TrimSuffix(cfg.DataDir, string(filepath.Separator)), cfg.Now().UTC().Format("20060102T150405Z"))
	if cfg.DryRun {
		say("would copy %s to %s", cfg.DataDir, backup)
		say("would start etcd once with --force-new-cluster on it: keep every entry %s committed, remove %s", r.Self.Name, labels(others))
		say("dry run: nothing changed")
		return r, nil
	}
	if _, err := os.Stat(backup); err == nil {
		return nil, fmt.Errorf("%w: %s exists already", ErrRefused, backup)
	}
	say("copying %s to %s", cfg.DataDir, backup)
	if err := copyTree(cfg.DataDir, backup); err != nil {
		_ = os.RemoveAll(backup)
		return nil, fmt.Errorf("back up the data directory: %w", err)
	}
	r.Backup = backup
	say("starting etcd once with --force-new-cluster (removes %s)", labels(others))
	if err := forceNewCluster(ctx, cfg, r.Self); err != nil {
		return r, fmt.Errorf("%w (the data directory as it was is in %s)", err, backup)
	}
	after, _, err := readMembers(db)
	if err != nil {
		return r, err
	}
	if len(after) != 1 || after[0].ID != r.Self.ID {
		return r, fmt.Errorf("after --force-new-cluster the data directory lists %s, not %s alone (the data directory as it was is in %s)", labels(after), r.Self.label(), backup)
	}
	say("%s is now a one-member cluster (same cluster ID, member ID and peer URL %s); start its etcd", cfg.DataDir, strings.Join(r.Self.PeerURLs, ","))
	return r, nil
}

// mostAdvanced is the voter of ms that knows the most committed, or nil.
// Learners are left out: recovery refuses to start from one.
func mostAdvanced(ms []Member) *Member {
	var best *Member
	for i := range ms {
		if ms[i].IsLearner {
			continue
		}
		if best == nil || ms[i].Committed > best.Committed {
			best = &ms[i]
		}
	}
	return best
}

func labels(ms []Member) string {
	if len(ms) == 0 {
		return "no other member"
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.label())
	}
	return strings.Join(out, ", ")
}

// WaitStopped waits until no etcd holds the database in dataDir (its
// process has exited), for up to timeout.
func WaitStopped(ctx context.Context, dataDir string, timeout time.Duration) error {
	db := filepath.Join(dataDir, "member", "snap", "db")
	deadline := time.Now().Add(timeout)
	for {
		d, err := bbolt.Open(db, 0o400, &bbolt.Options{ReadOnly: true, Timeout: lockWait})
		if err == nil {
			return d.Close()
		}
		if !errors.Is(err, bbolt.ErrTimeout) {
			return fmt.Errorf("%w: cannot read %s as etcd's database: %w", ErrRefused, db, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd still holds %s after %v", db, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// errRunning marks the refusal of a database that a running etcd holds.
var errRunning = errors.New("etcd is running")

// readMembers reads the member list from etcd's database, read-only, and
// the last raft index the member applied to it (etcd's consistent index).
// A running etcd holds the database's lock: that is how one is told apart.
func readMembers(path string) ([]Member, uint64, error) {
	db, err := bbolt.Open(path, 0o400, &bbolt.Options{ReadOnly: true, Timeout: lockWait})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, 0, fmt.Errorf("%w: %w on %s (its database is locked); stop it first (kubeadm: `kubeadm` does, by moving its static pod manifest away)", ErrRefused, errRunning, filepath.Dir(filepath.Dir(filepath.Dir(path))))
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: cannot read %s as etcd's database: %w", ErrRefused, path, err)
	}
	defer db.Close()
	var out []Member
	var applied uint64
	err = db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("members"))
		if b == nil {
			return fmt.Errorf("%w: %s has no member list: not etcd's database", ErrRefused, path)
		}
		// etcd's schema: bucket "meta", key "consistent_index", 8 bytes
		// big-endian.
		if m := tx.Bucket([]byte("meta")); m != nil {
			if v := m.Get([]byte("consistent_index")); len(v) == 8 {
				applied = binary.BigEndian.Uint64(v)
			}
		}
		return b.ForEach(func(_, v []byte) error {
			var m Member
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("%w: a member record in %s: %w", ErrRefused, path, err)
			}
			out = append(out, m)
			return nil
		})
	})
	if err != nil {
		return nil, 0, err
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("%w: %s lists no members", ErrRefused, path)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out, applied, nil
}

// walCommit is the commit index in the last hard state of the member's
// write-ahead log, read without locking or changing it (a torn last record
// is ignored, as etcd does in read mode).
func walCommit(dataDir string) (uint64, error) {
	lg := zap.NewNop()
	dir := filepath.Join(dataDir, "member", "wal")
	snaps, err := wal.ValidSnapshotEntries(lg, dir)
	if err != nil {
		return 0, err
	}
	var from walpb.Snapshot
	if len(snaps) > 0 {
		from = snaps[len(snaps)-1]
	}
	w, err := wal.OpenForRead(lg, dir, from)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	_, st, _, err := w.ReadAll()
	if err != nil {
		return 0, err
	}
	return st.Commit, nil
}

// readMembersOfCopy reads the member list from a copy of a database that a
// running etcd holds, for a dry run. bbolt reads the copy from its last
// valid meta page. etcd without quorum commits nothing, so the copy is
// whole; one taken while etcd commits may be torn, and then either fails
// to read or, rarely, shows a member list that is not current, which only
// a dry run ever sees.
func readMembersOfCopy(path string) ([]Member, uint64, error) {
	dir, err := os.MkdirTemp("", "vigil-recover-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	cp := filepath.Join(dir, "db")
	if err := copyFile(path, cp, 0o600); err != nil {
		return nil, 0, fmt.Errorf("copy %s to read it: %w", path, err)
	}
	return readMembers(cp)
}

// answers returns the members whose client URLs answer Status, each with
// the raft index it knows committed.
func answers(ctx context.Context, ms []Member, tc *tls.Config) []Member {
	var mu sync.Mutex
	var out []Member
	var wg sync.WaitGroup
	for _, m := range ms {
		if len(m.ClientURLs) == 0 {
			continue
		}
		wg.Go(func() {
			cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientURLs, TLS: tc, DialTimeout: statusTimeout, Logger: zap.NewNop()})
			if err != nil {
				return
			}
			defer cli.Close()
			for _, ep := range m.ClientURLs {
				sctx, cancel := context.WithTimeout(ctx, statusTimeout)
				st, err := cli.Status(sctx, ep)
				cancel()
				if err == nil {
					m.Committed = st.RaftIndex // etcd: "the current raft committed index"
					mu.Lock()
					out = append(out, m)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// forceNewCluster starts etcd once on the data directory with
// --force-new-cluster, listening on loopback only, waits until it serves
// (the removal of every other member is then committed) and stops it.
func forceNewCluster(ctx context.Context, cfg Config, self Member) error {
	if len(self.PeerURLs) == 0 {
		return fmt.Errorf("%s has no peer URL in the data directory", self.label())
	}
	peer, err := url.Parse(self.PeerURLs[0])
	if err != nil {
		return fmt.Errorf("%s's peer URL %q: %w", self.label(), self.PeerURLs[0], err)
	}
	local := func() url.URL { return url.URL{Scheme: "http", Host: "127.0.0.1:0"} }
	ec := embed.NewConfig()
	ec.Name = self.Name
	ec.Dir = cfg.DataDir
	ec.ForceNewCluster = true
	// Nobody is meant to reach it: loopback, ports of the kernel's choosing.
	ec.ListenPeerUrls = []url.URL{local()}
	ec.ListenClientUrls = []url.URL{local()}
	// What it advertises stays what the member advertised, so that the
	// attributes it publishes on start are the member's own.
	ec.AdvertisePeerUrls = []url.URL{*peer}
	ec.InitialCluster = self.Name + "=" + peer.String()
	if len(self.ClientURLs) > 0 {
		var adv []url.URL
		for _, s := range self.ClientURLs {
			if u, err := url.Parse(s); err == nil {
				adv = append(adv, *u)
			}
		}
		ec.AdvertiseClientUrls = adv
	}
	ec.LogLevel = "error"
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start etcd with --force-new-cluster on %s: %w", cfg.DataDir, err)
	}
	defer func() {
		e.Close()
		<-e.Server.StopNotify()
	}()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("etcd with --force-new-cluster on %s: %w", cfg.DataDir, err)
	case <-time.After(cfg.Timeout):
		return fmt.Errorf("etcd with --force-new-cluster on %s did not serve within %v", cfg.DataDir, cfg.Timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	// Ready means it published its attributes through raft: the removals,
	// committed before them, are applied.
	if ms := e.Server.Cluster().Members(); len(ms) != 1 || uint64(ms[0].ID) != self.ID {
		return fmt.Errorf("etcd with --force-new-cluster lists %d members", len(ms))
	}
	return nil
}

// copyTree copies the directory src to dst (which must not exist),
// regular files and directories, keeping their modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(to, info.Mode().Perm())
		case info.Mode().IsRegular():
			return copyFile(p, to, info.Mode().Perm())
		default:
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
