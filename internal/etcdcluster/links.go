package etcdcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// A member whose client port does not answer may still be a working raft
// member: its client port filtered, or its gRPC server stalled by a long
// defragmentation, while its peer port replicates as before. Raft keeps no
// per-follower state a client can ask for (Status says nothing of the
// other members), but each member's raft transport does, and publishes it
// as a metric on the client URL:
//
//	etcd_network_active_peers{Local="<its ID>",Remote="<peer ID>"} 1
//
// is 1 while the member's transport has a working link with the peer (a
// stream attached or dialled, a message sent) and drops to 0 when a send
// fails, a stream's link heartbeat (every ~1.7 s) cannot be written, or
// a stream reads nothing for 5 s. A member that is powered off, partitioned
// or whose etcd stopped loses every link within about 5 s; one that raft
// still replicates to keeps them.

// metricsLimit bounds the /metrics answer read: etcd's is a few hundred
// KiB.
const metricsLimit = 16 << 20

// PeerLinks asks the member at endpoint, whose ID is local, which peers
// its raft transport has a working link with: the IDs whose link is up
// (true) or down (false), as the member sees them now. endpoint must have
// answered as a member of this cluster (Status) just before: the metrics
// endpoint does not say which cluster it belongs to.
func (c *Cluster) PeerLinks(ctx context.Context, endpoint string, local uint64) (map[uint64]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.metricsClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s/metrics: %w", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read %s/metrics: %s", endpoint, resp.Status)
	}
	return parsePeerLinks(io.LimitReader(resp.Body, metricsLimit), local)
}

// metricsClient is an HTTP client with the cluster's TLS configuration.
// It keeps no idle connection: links are read seldom, when a member stops
// answering.
func (c *Cluster) metricsClient() *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.http == nil {
		t := &http.Transport{DisableKeepAlives: true, Proxy: nil}
		if c.cfg.TLS != nil {
			t.TLSClientConfig = c.cfg.TLS.Clone()
		}
		c.http = &http.Client{Transport: t}
	}
	return c.http
}

// parsePeerLinks reads etcd_network_active_peers with Local = local from
// Prometheus text. Other Locals are other members in the same process
// (embedded etcd shares one registry).
func parsePeerLinks(r io.Reader, local uint64) (map[uint64]bool, error) {
	const name = "etcd_network_active_peers{"
	want := strconv.FormatUint(local, 16)
	// A peer the member never had a working link with has no line: it
	// reads as down.
	links := map[uint64]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(name):], "} ")
		if !ok {
			return nil, fmt.Errorf("etcd metrics: cannot read %q", line)
		}
		var from, to string
		for _, l := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(l, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "Local":
				from = v
			case "Remote":
				to = v
			}
		}
		if from != want {
			continue
		}
		id, err := strconv.ParseUint(to, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("etcd metrics: peer ID in %q: %w", line, err)
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("etcd metrics: value in %q: %w", line, err)
		}
		links[id] = n > 0
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("etcd metrics: %w", err)
	}
	return links, nil
}
