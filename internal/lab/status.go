package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// EtcdMember is one member as the lab sees it.
type EtcdMember struct {
	Name      string `json:"name"`
	Reachable bool   `json:"reachable"`
	Leader    string `json:"leader,omitempty"` // the leader this member follows
}

// EtcdStatus is the lab's view of its etcd cluster.
type EtcdStatus struct {
	Leader  string       `json:"leader"`
	Members []EtcdMember `json:"members"`
	// RaftTerm is the highest raft term a member reported: it grows by
	// one or more with every raft election.
	RaftTerm uint64 `json:"raftTerm"`
}

// etcdStatus asks every member for its status from the client namespace.
func (l *Lab) etcdStatus(ctx context.Context) (EtcdStatus, error) {
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return EtcdStatus{}, err
	}
	defer cli.Close()
	mctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ml, err := cli.MemberList(mctx)
	if err != nil {
		return EtcdStatus{}, fmt.Errorf("etcd member list: %w", err)
	}
	names := map[uint64]string{}
	for _, m := range ml.Members {
		names[m.ID] = m.Name
	}
	var st EtcdStatus
	for _, n := range l.st.Nodes {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		resp, err := cli.Status(sctx, fmt.Sprintf("http://%s:2379", n.IP))
		cancel()
		m := EtcdMember{Name: n.Name}
		if err == nil {
			m.Reachable = true
			st.RaftTerm = max(st.RaftTerm, resp.RaftTerm)
			m.Leader = names[resp.Leader]
			if resp.Leader == resp.Header.MemberId {
				st.Leader = n.Name
			}
		}
		st.Members = append(st.Members, m)
	}
	return st, nil
}

// vipWatch reads, through netlink inside each node's namespace, which nodes
// have the VIP on their interface.
type vipWatch struct {
	handles map[string]*netlink.Handle
}

func newVIPWatch(nodes []*Node) (*vipWatch, error) {
	w := &vipWatch{handles: map[string]*netlink.Handle{}}
	for _, n := range nodes {
		ns, err := netns.GetFromName(nodeNS(n.Name))
		if err != nil {
			w.close()
			return nil, fmt.Errorf("open netns of %s: %w", n.Name, err)
		}
		h, err := netlink.NewHandleAt(ns)
		ns.Close()
		if err != nil {
			w.close()
			return nil, fmt.Errorf("netlink in %s: %w", n.Name, err)
		}
		w.handles[n.Name] = h
	}
	return w, nil
}

func (w *vipWatch) close() {
	for _, h := range w.handles {
		h.Close()
	}
}

// has reports whether node has the VIP: any of its addresses, of either
// family.
func (w *vipWatch) has(node string) (bool, error) {
	h, ok := w.handles[node]
	if !ok {
		return false, fmt.Errorf("lab: node %s is not watched (it joined after the watch began)", node)
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && slices.Contains(labVIPs, ip.Unmap()) {
			return true, nil
		}
	}
	return false, nil
}

// holders returns which of nodes have the VIP, sorted.
//
// The nodes are read one after another, not at one instant, so a reader
// descheduled between two reads (a loaded machine) could see the old
// holder before it let go and the new one after it took over: two holders
// that never were. So when a first pass finds two or more, a second pass
// reads those again. A node seen with the VIP in both passes had it from
// its first read to its second, and each such span covers the moment
// between the end of the first pass and the start of the second: two such
// nodes held it at once. Otherwise the second pass's holders are the answer.
func (w *vipWatch) holders(nodes []*Node) ([]string, error) { return holders(w.has, nodes) }

func holders(has func(node string) (bool, error), nodes []*Node) ([]string, error) {
	held, err := read(has, nodes)
	if err == nil && len(held) > 1 {
		held, err = read(has, held)
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(held))
	for _, n := range held {
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out, nil
}

// read is one pass of holders: every node's addresses, one after another.
func read(has func(node string) (bool, error), nodes []*Node) ([]*Node, error) {
	var out []*Node
	for _, n := range nodes {
		ok, err := has(n.Name)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, n)
		}
	}
	return out, nil
}

// flushVIP removes the VIP from a node, whichever link has it, as a reboot
// would.
func (w *vipWatch) flushVIP(node string) error {
	h := w.handles[node]
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); !ok || !slices.Contains(labVIPs, ip.Unmap()) {
			continue
		}
		lk, err := h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return err
		}
		if err := h.AddrDel(lk, &a); err != nil {
			return err
		}
	}
	return nil
}

// Report is what `vigil-lab status` prints.
type Report struct {
	Impl      string   `json:"impl"`
	VIP       string   `json:"vip"`
	Holders   []string `json:"vipHolders"`
	Answering string   `json:"answering"`
	// AnsweringByVIP, in a dual-stack lab, is who answers on each address.
	AnsweringByVIP map[string]string `json:"answeringByVIP,omitempty"`
	Etcd           *EtcdStatus       `json:"etcd,omitempty"`
	NodeStates     []NodeState       `json:"nodes"`
	// Workers run vigil agent; Etcd FOLLOWS does not apply to them.
	Workers []NodeState `json:"workers,omitempty"`
	// Router is the routed lab's route to the VIP (--announce bgp).
	Router *RouterRoute `json:"router,omitempty"`
}

// NodeState summarises one node.
type NodeState struct {
	Name    string          `json:"name"`
	IP      string          `json:"ip"`
	Cut     bool            `json:"cut"`
	Running map[string]bool `json:"running"`
}

// Status reports the lab's state.
func (l *Lab) Status(ctx context.Context) (Report, error) {
	var vips []string
	for _, v := range l.st.Settings.vips() {
		vips = append(vips, v.String())
	}
	r := Report{Impl: l.st.Settings.Impl, VIP: strings.Join(vips, ",")}
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return r, err
	}
	defer w.close()
	if r.Holders, err = w.holders(l.st.Nodes); err != nil {
		return r, err
	}
	for i, v := range l.st.Settings.vips() {
		ans, _ := probeOnce(ctx, v.Addr(), 300*time.Millisecond) // "" when nobody answers
		if i == 0 {
			r.Answering = ans
			continue
		}
		if r.AnsweringByVIP == nil {
			r.AnsweringByVIP = map[string]string{l.st.Settings.vipAddr().String(): r.Answering}
		}
		r.AnsweringByVIP[v.Addr().String()] = ans
	}
	if l.st.Settings.Impl == ImplVigil {
		if st, err := l.etcdStatus(ctx); err == nil {
			r.Etcd = &st
		}
	}
	for _, n := range l.st.Nodes {
		ns := NodeState{Name: n.Name, IP: n.IP.String(), Cut: n.Cut, Running: map[string]bool{}}
		for role, pid := range n.PIDs {
			ns.Running[role] = alive(pid)
		}
		r.NodeStates = append(r.NodeStates, ns)
	}
	if l.st.Settings.bgp() {
		if rr, err := l.VIPRoute(ctx); err == nil {
			r.Router = &rr
		}
	}
	for _, n := range l.st.Workers {
		ns := NodeState{Name: n.Name, IP: n.IP.String(), Running: map[string]bool{}}
		for role, pid := range n.PIDs {
			ns.Running[role] = alive(pid)
		}
		r.Workers = append(r.Workers, ns)
	}
	return r, nil
}
