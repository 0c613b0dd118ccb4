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
// other members), but each member's raft transport counts what it
// receives from each peer, and publishes it on the client URL:
//
//	etcd_network_peer_received_bytes_total{From="<peer ID>"} 731560
//
// A live member sends raft messages all the time: a follower answers the
// leader's heartbeats (every 100 ms by default), a leader sends them. So
// the leader's count for a live follower, and the followers' counts for a
// live leader, grow between two reads a second apart; a member that is
// powered off, partitioned or stopped sends nothing, and every count for
// it stands still. (etcd's etcd_network_active_peers is no substitute: a
// follower's link with another follower that lost power was seen to stay
// "active" for minutes.)

// metricsLimit bounds the /metrics answer read: etcd's is a few hundred
// KiB.
const metricsLimit = 16 << 20

// PeerTraffic asks the member at endpoint how many bytes its raft
// transport has received from each peer, by peer ID, since it started.
// endpoint must have answered as a member of this cluster (Status) just
// before: the metrics do not say which cluster they belong to.
func (c *Cluster) PeerTraffic(ctx context.Context, endpoint string) (map[uint64]float64, error) {
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
	return parsePeerTraffic(io.LimitReader(resp.Body, metricsLimit))
}

// metricsClient is an HTTP client with the cluster's TLS configuration.
// It keeps no idle connection: the metrics are read seldom, while a
// member does not answer.
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

// parsePeerTraffic reads etcd_network_peer_received_bytes_total from
// Prometheus text. From="0" is the transport's own link heartbeats, which
// name no sender; it is left out.
func parsePeerTraffic(r io.Reader) (map[uint64]float64, error) {
	const name = "etcd_network_peer_received_bytes_total{"
	out := map[uint64]float64{}
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
		var from string
		for _, l := range strings.Split(labels, ",") {
			if k, v, _ := strings.Cut(l, "="); k == "From" {
				from = strings.Trim(v, `"`)
			}
		}
		id, err := strconv.ParseUint(from, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("etcd metrics: peer ID in %q: %w", line, err)
		}
		if id == 0 {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("etcd metrics: value in %q: %w", line, err)
		}
		out[id] += n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("etcd metrics: %w", err)
	}
	return out, nil
}
