package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vigil-ha/vigil/internal/validate"
)

// cacheFile is what the agent keeps on disk: the backends it learned last,
// so that a restarted agent serves at once, even while the seeds are down.
type cacheFile struct {
	Version        int       `json:"version"`
	Saved          time.Time `json:"saved"`
	APIServers     []string  `json:"apiServers"`
	Etcd           []string  `json:"etcd,omitempty"`
	EtcdClientURLs []string  `json:"etcdClientURLs,omitempty"`
}

const cacheName = "backends.json"

func (a *Agent) cachePath() string { return filepath.Join(a.cfg.CacheDir, cacheName) }

// loadCache restores the learned backends. A missing cache is normal (first
// start); an unreadable or invalid one is logged and ignored: the seeds and
// discovery still work.
func (a *Agent) loadCache() {
	if a.cfg.CacheDir == "" {
		return
	}
	b, err := os.ReadFile(a.cachePath())
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var c cacheFile
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil {
		err = validCache(c)
	}
	if err != nil {
		a.log.Warn("ignoring the backend cache", "path", a.cachePath(), "err", err)
		return
	}
	a.api.setLearned(c.APIServers)
	if a.etcd != nil {
		a.etcd.setLearned(c.Etcd)
	}
	a.mu.Lock()
	a.etcdURLs = c.EtcdClientURLs
	a.mu.Unlock()
	a.log.Info("backends from the cache", "path", a.cachePath(), "saved", c.Saved.Format(time.RFC3339),
		"apiservers", c.APIServers, "etcd", c.Etcd)
}

func validCache(c cacheFile) error {
	if c.Version != 1 {
		return fmt.Errorf("version %d, want 1", c.Version)
	}
	for _, hp := range slices.Concat(c.APIServers, c.Etcd) {
		if h, p, err := net.SplitHostPort(hp); err != nil || h == "" || p == "" {
			return fmt.Errorf("backend %q is not HOST:PORT", hp)
		}
	}
	if _, _, err := parseEtcdURLs(c.EtcdClientURLs); err != nil {
		return err
	}
	return nil
}

// saveCache writes the learned backends atomically (write, then rename).
func (a *Agent) saveCache() {
	if a.cfg.CacheDir == "" {
		return
	}
	a.mu.Lock()
	c := cacheFile{Version: 1, Saved: time.Now().UTC(), APIServers: a.api.learnedList(), EtcdClientURLs: slices.Clone(a.etcdURLs)}
	a.mu.Unlock()
	if a.etcd != nil {
		c.Etcd = a.etcd.learnedList()
	}
	b, _ := json.MarshalIndent(c, "", "  ")
	tmp := a.cachePath() + ".tmp"
	err := os.WriteFile(tmp, append(b, '\n'), 0o644)
	if err == nil {
		err = os.Rename(tmp, a.cachePath())
	}
	if err != nil {
		a.m.cacheErrors.Inc()
		a.log.Warn("cannot write the backend cache; a restart will start from the seeds", "err", err)
	}
}

// ensureCacheDir creates the cache directory at start, so a bad --cache-dir
// is reported at once rather than at the first membership change.
func ensureCacheDir(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%w: `cacheDir`: %w", validate.ErrInvalid, err)
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("%w: `cacheDir` %s is not writable: %w", validate.ErrInvalid, dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
