// Package bgp announces the VIP to routers as a host route (/32, /128)
// over BGP, with GoBGP as a library: only the holder advertises it, and it
// withdraws it when it steps down.
//
// A hard-killed holder cannot withdraw, and a router keeps its route until
// the BGP hold timer runs out (3 s at the least, 9 s by default). The new
// holder does not wait for that: it advertises the VIP with a lower MED
// than any earlier holder did (MED counts down with the election's holder
// transitions, see MED), and a router prefers the lower MED among routes
// from one neighbouring AS at once. docs/bgp.md has the reasoning.
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/vigil-ha/vigil/internal/bfd"
	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid is wrapped by every configuration error.

// Default timers of every session. The hold time bounds how long a router
// keeps the routes of a speaker that went silent (a killed or paused
// vigil); failover does not wait for it (see the package comment), so the
// default is the common "fast" profile rather than the smallest allowed.
const (
	DefaultHoldTime  = 9 * time.Second
	DefaultKeepalive = 3 * time.Second
	// MinHoldTime is BGP's smallest hold time other than 0 (RFC 4271,
	// 4.2); vigil does not offer 0, which turns off the detection of a
	// silent speaker.
	MinHoldTime = 3 * time.Second
	// GracefulRestartTime is the restart time advertised with
	// --bgp-graceful-restart: how long a router keeps this node's routes
	// after its session drops, as long as the default hold time.
	GracefulRestartTime = 9 * time.Second
)

// Seconds of the timers that are not configurable.
const (
	connectRetry = 2
	// idleHold is how long a session waits after a reset before it
	// connects again (GoBGP's default is 30 s).
	idleHold = 2
)

// Well-known communities (RFC 1997) that --bgp-community takes by name.
var wellKnownCommunities = map[string]uint32{
	"no-export":           0xFFFFFF01,
	"no-advertise":        0xFFFFFF02,
	"no-export-subconfed": 0xFFFFFF03,
}

// ParseCommunity parses one --bgp-community: AS:VALUE, each 0 to 65535, or
// a well-known name (no-export, no-advertise, no-export-subconfed).
func ParseCommunity(s string) (uint32, error) {
	if c, ok := wellKnownCommunities[strings.ToLower(strings.TrimSpace(s))]; ok {
		return c, nil
	}
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), ":")
	a, errA := strconv.ParseUint(hi, 10, 16)
	b, errB := strconv.ParseUint(lo, 10, 16)
	if !ok || errA != nil || errB != nil {
		return 0, fmt.Errorf("%w: `bgpCommunity` %q: give AS:VALUE, each 0 to 65535 (65001:100), or no-export, no-advertise or no-export-subconfed", validate.ErrInvalid, s)
	}
	return uint32(a)<<16 | uint32(b), nil
}

// FormatCommunity is c as --bgp-community takes it.
func FormatCommunity(c uint32) string {
	for name, v := range wellKnownCommunities {
		if v == c {
			return name
		}
	}
	return fmt.Sprintf("%d:%d", c>>16, c&0xFFFF)
}

// Peer is one BGP neighbour.
type Peer struct {
	Address  netip.Addr
	AS       uint32
	Password string // TCP MD5 password ("" for none), read from a file
	// PasswordFile is where Password comes from: password-file=PATH, or
	// --bgp-password-file for every peer without one (LoadPassword).
	PasswordFile string
	Port         uint16 // 179 when 0
}

// String is the peer as --bgp-peer takes it, without the password.
func (p Peer) String() string {
	s := fmt.Sprintf("%s,%d", p.Address, p.AS)
	if p.Port != 0 && p.Port != 179 {
		s += ",port=" + strconv.Itoa(int(p.Port))
	}
	return s
}

// ParsePeer parses --bgp-peer's ADDRESS,AS[,password-file=PATH][,port=N].
// A password itself (password=SECRET) is refused: on a command line every
// process of the node can read it (ps), and in a static pod so can anyone
// who may read the mirror pod.
func ParsePeer(s string) (Peer, error) {
	parts := strings.Split(s, ",")
	bad := func(format string, a ...any) (Peer, error) {
		return Peer{}, fmt.Errorf("%w: `bgpPeer` %q: %s (want ADDRESS,AS[,password-file=PATH][,port=N])", validate.ErrInvalid, redact(s), fmt.Sprintf(format, a...))
	}
	if len(parts) < 2 {
		return bad("no AS number")
	}
	var p Peer
	var err error
	if p.Address, err = netip.ParseAddr(strings.TrimSpace(parts[0])); err != nil || p.Address.Zone() != "" {
		return bad("%q is not an IP address", parts[0])
	}
	p.Address = p.Address.Unmap()
	as, err := strconv.ParseUint(strings.TrimSpace(parts[1]), 10, 32)
	if err != nil || as == 0 || as == math.MaxUint32 {
		return bad("AS %q: give a number from 1 to 4294967294", parts[1])
	}
	p.AS = uint32(as)
	for _, kv := range parts[2:] {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return bad("%q is not KEY=VALUE", kv)
		case k == "password":
			return bad("a password on the command line can be read by every process on the node (ps) and in the mirror pod; put it in a file readable by vigil alone and give password-file=PATH, or `bgpPasswordFile` PATH for every peer")
		case k == "password-file":
			if !filepath.IsAbs(v) {
				return bad("password-file %q: give an absolute path", v)
			}
			p.PasswordFile = v
		case k == "port":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return bad("port %q: give 1 to 65535", v)
			}
			p.Port = uint16(n)
		default:
			return bad("unknown key %q (password-file or port)", k)
		}
	}
	return p, nil
}

// maxPasswordLen is the longest TCP MD5 key Linux takes
// (TCP_MD5SIG_MAXKEYLEN).
const maxPasswordLen = 80

// LoadPassword reads the peer's TCP MD5 password from its PasswordFile, or,
// without one, from fallback (--bgp-password-file; "" for none): the
// file's first line, without its line end.
func (p *Peer) LoadPassword(fallback string) error {
	if p.PasswordFile == "" {
		p.PasswordFile = fallback
	}
	if p.PasswordFile == "" {
		return nil
	}
	b, err := os.ReadFile(p.PasswordFile)
	if err != nil {
		return fmt.Errorf("%w: the BGP password of peer %s: %w", validate.ErrInvalid, p.Address, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSuffix(line, "\r")
	switch {
	case line == "":
		return fmt.Errorf("%w: the BGP password of peer %s: %s holds no password on its first line", validate.ErrInvalid, p.Address, p.PasswordFile)
	case len(line) > maxPasswordLen:
		return fmt.Errorf("%w: the BGP password of peer %s in %s is %d bytes; TCP MD5 keys are %d at most", validate.ErrInvalid, p.Address, p.PasswordFile, len(line), maxPasswordLen)
	}
	p.Password = line
	return nil
}

// redact hides a password in s, for error messages and logs.
func redact(s string) string {
	parts := strings.Split(s, ",")
	for i, kv := range parts {
		if strings.HasPrefix(kv, "password=") {
			parts[i] = "password=***"
		}
	}
	return strings.Join(parts, ",")
}

// Config configures a Speaker.
type Config struct {
	LocalAS  uint32
	RouterID netip.Addr // an IPv4 address, by BGP's rules
	Peers    []Peer
	// HoldTime and Keepalive are every session's timers, whole seconds
	// (0: DefaultHoldTime, DefaultKeepalive). The session uses the smaller
	// of the two sides' hold times.
	HoldTime, Keepalive time.Duration
	// Multihop is the TTL of the sessions to eBGP peers that are not on a
	// directly connected network (0: off, TTL 1).
	Multihop uint8
	// SourceAddress is the local address of every session (invalid: the
	// kernel's choice towards each peer). It is then also the IPv4 or IPv6
	// next hop of the VIP's route on those sessions.
	SourceAddress netip.Addr
	// Communities are standard communities (RFC 1997) on the VIP's route.
	Communities []uint32
	// LocalPref is the LOCAL_PREF on the VIP's route (0: none); BGP sends
	// it to iBGP peers only.
	LocalPref uint32
	// GracefulRestart advertises the graceful restart capability (RFC
	// 4724), with GracefulRestartTime: routers keep this node's routes
	// that long after its session drops.
	GracefulRestart bool
	// BFDInterval, when not 0, runs a BFD session (package bfd) to every
	// peer, each side sending every BFDInterval and declaring the other
	// down after BFDMultiplier intervals without a packet. A router that
	// ties its BGP session to it drops a dead node's routes within that
	// time rather than the hold time; on this side, a peer whose BFD
	// session is not up counts as down (Eligible).
	BFDInterval   time.Duration
	BFDMultiplier uint8
}

// Timers are c's hold time and keepalive, defaults filled in.
func (c Config) Timers() (hold, keepalive time.Duration) {
	hold, keepalive = c.HoldTime, c.Keepalive
	if hold == 0 {
		hold = DefaultHoldTime
	}
	if keepalive == 0 {
		keepalive = DefaultKeepalive
	}
	return hold, keepalive
}

// Validate checks cfg and says which flag is wrong.
func (c Config) Validate() error {
	switch {
	case c.LocalAS == 0 || c.LocalAS == math.MaxUint32:
		return fmt.Errorf("%w: `bgpLocalAs`: give this node's AS number, 1 to 4294967294", validate.ErrInvalid)
	case !c.RouterID.IsValid() || !c.RouterID.Is4() || c.RouterID.IsUnspecified():
		return fmt.Errorf("%w: `bgpRouterId` %q: give an IPv4 address unique among the speakers, usually the node's own", validate.ErrInvalid, routerID(c.RouterID))
	case len(c.Peers) == 0:
		return fmt.Errorf("%w: `announce` bgp needs at least one `bgpPeer` ADDRESS,AS", validate.ErrInvalid)
	}
	seen := map[netip.Addr]bool{}
	for _, p := range c.Peers {
		if seen[p.Address] {
			return fmt.Errorf("%w: `bgpPeer` %s is given twice", validate.ErrInvalid, p.Address)
		}
		seen[p.Address] = true
	}
	hold, keepalive := c.Timers()
	switch {
	case hold%time.Second != 0 || keepalive%time.Second != 0:
		return fmt.Errorf("%w: `bgpHoldTime` %v and `bgpKeepalive` %v: BGP counts its timers in whole seconds", validate.ErrInvalid, hold, keepalive)
	case hold < MinHoldTime || hold > math.MaxUint16*time.Second:
		return fmt.Errorf("%w: `bgpHoldTime` %v: give 3s to 65535s (BGP's bounds; 0, no hold timer, would leave a dead node's route with the routers)", validate.ErrInvalid, hold)
	case keepalive < time.Second:
		return fmt.Errorf("%w: `bgpKeepalive` %v: give at least 1s", validate.ErrInvalid, keepalive)
	case hold < 3*keepalive:
		return fmt.Errorf("%w: `bgpHoldTime` %v is less than 3 x `bgpKeepalive` %v: one lost keepalive would end the session; give a hold time of at least %v or a shorter keepalive", validate.ErrInvalid, hold, keepalive, 3*keepalive)
	}
	if c.SourceAddress.IsValid() {
		if c.SourceAddress.IsUnspecified() || c.SourceAddress.IsMulticast() || c.SourceAddress.Zone() != "" {
			return fmt.Errorf("%w: `bgpSourceAddress` %s: give one of this node's unicast addresses", validate.ErrInvalid, c.SourceAddress)
		}
		for _, p := range c.Peers {
			if p.Address.Is4() != c.SourceAddress.Is4() {
				return fmt.Errorf("%w: `bgpSourceAddress` %s cannot reach `bgpPeer` %s (another address family): a session leaves from one address; give peers of its family only", validate.ErrInvalid, c.SourceAddress, p.Address)
			}
		}
	}
	if c.Multihop > 0 && !slices.ContainsFunc(c.Peers, func(p Peer) bool { return p.AS != c.LocalAS }) {
		return fmt.Errorf("%w: `bgpMultihop` %d: applies to eBGP peers only, and every `bgpPeer` is in `bgpLocalAs` %d (iBGP sessions are multihop already)", validate.ErrInvalid, c.Multihop, c.LocalAS)
	}
	cs := map[uint32]bool{}
	for _, x := range c.Communities {
		if cs[x] {
			return fmt.Errorf("%w: `bgpCommunity` %s is given twice", validate.ErrInvalid, FormatCommunity(x))
		}
		cs[x] = true
	}
	if c.BFDInterval != 0 || c.BFDMultiplier != 0 {
		if err := bfd.ValidateTimers(c.BFDInterval, c.BFDMultiplier); err != nil {
			return err
		}
		if c.Multihop > 0 {
			return fmt.Errorf("%w: `bgpBfd` with `bgpMultihop`: vigil's BFD is single-hop (RFC 5881), for routers on the node's own network", validate.ErrInvalid)
		}
	}
	if c.LocalPref > 0 && !slices.ContainsFunc(c.Peers, func(p Peer) bool { return p.AS == c.LocalAS }) {
		return fmt.Errorf("%w: `bgpLocalPref` %d: BGP sends LOCAL_PREF to iBGP peers only, and no `bgpPeer` is in `bgpLocalAs` %d; to steer eBGP routers use `bgpCommunity` with their policy", validate.ErrInvalid, c.LocalPref, c.LocalAS)
	}
	return nil
}

// Settings is what the speaker runs with, for vigil status.
type Settings struct {
	HoldTime        string   `json:"holdTime"`
	Keepalive       string   `json:"keepalive"`
	Multihop        uint8    `json:"multihop,omitempty"`
	SourceAddress   string   `json:"sourceAddress,omitempty"`
	Communities     []string `json:"communities,omitempty"`
	LocalPref       uint32   `json:"localPref,omitempty"`
	GracefulRestart bool     `json:"gracefulRestart,omitempty"`
	// BFD is "INTERVAL x MULTIPLIER" when BFD runs.
	BFD string `json:"bfd,omitempty"`
}

// Settings reports c's timers and route policy.
func (c Config) Settings() Settings {
	hold, keepalive := c.Timers()
	s := Settings{HoldTime: hold.String(), Keepalive: keepalive.String(), Multihop: c.Multihop,
		LocalPref: c.LocalPref, GracefulRestart: c.GracefulRestart}
	if c.SourceAddress.IsValid() {
		s.SourceAddress = c.SourceAddress.String()
	}
	for _, x := range c.Communities {
		s.Communities = append(s.Communities, FormatCommunity(x))
	}
	if c.BFDInterval != 0 {
		s.BFD = fmt.Sprintf("%v x %d", c.BFDInterval, c.BFDMultiplier)
	}
	return s
}

func routerID(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// MED is the MULTI_EXIT_DISC a holder advertises: lower for every later
// holder (transitions counts changes of holder, from the election's
// record), so a router prefers the newest holder's route even while an
// older holder's stays in its table, until that one's session times out.
func MED(transitions int) uint32 {
	if transitions < 0 {
		transitions = 0
	}
	if transitions >= math.MaxUint32-1 {
		return 1
	}
	return math.MaxUint32 - 1 - uint32(transitions)
}

// PeerState is one session's state, for status and metrics.
type PeerState struct {
	Peer        string `json:"peer"`
	State       string `json:"state"` // idle, connect, active, opensent, openconfirm, established
	Established bool   `json:"established"`
	// BFD is the BFD session's state (up, down, init) when BFD runs;
	// Established is then false unless it is up.
	BFD string `json:"bfd,omitempty"`
}

// Speaker is this node's BGP speaker. It connects to every peer at Start
// and stays connected whether or not this node holds the VIP, so a new
// holder's route goes out on a session that is already up.
type Speaker struct {
	cfg Config
	log *slog.Logger
	s   *server.BgpServer

	mu         sync.Mutex // guards advertised and states
	advertised []*api.Path
	// states is each peer's session state (by address), kept from GoBGP's
	// peer events: reading it never waits on the BGP server, so the
	// election's eligibility check cannot block on it.
	states map[string]api.PeerState_SessionState
	// bfd runs the BFD sessions (nil without BFD), one per peer.
	bfd         *bfd.Mux
	bfdSessions map[netip.Addr]*bfd.Session
}

// New validates cfg; nothing runs until Start.
func New(cfg Config, log *slog.Logger) (*Speaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Speaker{cfg: cfg, log: log.With("component", "bgp")}, nil
}

// Start runs the speaker and adds the peers. It does not wait for the
// sessions to come up.
func (sp *Speaker) Start(ctx context.Context) error {
	s := server.NewBgpServer(server.LoggerOption(&logger{log: sp.log}))
	go s.Serve()
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:        sp.cfg.LocalAS,
		RouterId:   sp.cfg.RouterID.String(),
		ListenPort: -1, // vigil connects out; it accepts no sessions
	}}); err != nil {
		s.Stop()
		return fmt.Errorf("bgp: start: %w", err)
	}
	sp.s = s
	sp.mu.Lock()
	sp.states = map[string]api.PeerState_SessionState{}
	for _, p := range sp.cfg.Peers {
		sp.states[p.Address.String()] = api.PeerState_IDLE
	}
	sp.mu.Unlock()
	// Session state changes: logged, and kept for Eligible and Peers.
	if err := s.WatchEvent(context.Background(), &api.WatchEventRequest{Peer: &api.WatchEventRequest_Peer{}}, sp.peerEvent); err != nil {
		sp.Close()
		return fmt.Errorf("bgp: watch sessions: %w", err)
	}
	for _, p := range sp.cfg.Peers {
		if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: sp.peer(p)}); err != nil {
			sp.Close()
			return fmt.Errorf("bgp: peer %s: %w", p, err)
		}
	}
	if sp.cfg.BFDInterval != 0 {
		if err := sp.startBFD(); err != nil {
			sp.Close()
			return err
		}
	}
	set := sp.cfg.Settings()
	sp.log.Info("BGP speaker started", "local_as", sp.cfg.LocalAS, "router_id", sp.cfg.RouterID, "peers", len(sp.cfg.Peers),
		"hold_time", set.HoldTime, "keepalive", set.Keepalive)
	return nil
}

// startBFD starts a BFD session to every peer, from --bgp-source-address
// or the address the kernel would use towards it.
func (sp *Speaker) startBFD() error {
	v4 := slices.ContainsFunc(sp.cfg.Peers, func(p Peer) bool { return p.Address.Is4() })
	v6 := slices.ContainsFunc(sp.cfg.Peers, func(p Peer) bool { return p.Address.Is6() })
	m, err := bfd.Listen(v4, v6, sp.log)
	if err != nil {
		return err
	}
	sessions := map[netip.Addr]*bfd.Session{}
	for _, p := range sp.cfg.Peers {
		local := sp.cfg.SourceAddress
		if !local.IsValid() {
			if local = SourceAddr(p.Address); !local.IsValid() {
				m.Close()
				return fmt.Errorf("bgp: BFD to %s: no route to it", p.Address)
			}
		}
		s, err := m.Add(bfd.Config{Local: local, Peer: p.Address, Interval: sp.cfg.BFDInterval, Multiplier: sp.cfg.BFDMultiplier}, nil)
		if err != nil {
			m.Close()
			return fmt.Errorf("bgp: BFD to %s: %w", p.Address, err)
		}
		sessions[p.Address] = s
	}
	sp.mu.Lock()
	sp.bfd, sp.bfdSessions = m, sessions
	sp.mu.Unlock()
	return nil
}

// SourceAddr is the local address the kernel would send from to reach dst
// (no packet is sent); invalid when there is no route.
func SourceAddr(dst netip.Addr) netip.Addr {
	c, err := net.Dial("udp", netip.AddrPortFrom(dst, 179).String())
	if err != nil {
		return netip.Addr{}
	}
	defer c.Close()
	if ua, ok := c.LocalAddr().(*net.UDPAddr); ok {
		return ua.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// peer is p's session as GoBGP takes it.
func (sp *Speaker) peer(p Peer) *api.Peer {
	hold, keepalive := sp.cfg.Timers()
	fams := []*api.AfiSafi{
		{Config: &api.AfiSafiConfig{Family: family(true), Enabled: true}},
		{Config: &api.AfiSafiConfig{Family: family(false), Enabled: true}},
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.AS, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime: uint64(hold / time.Second), KeepaliveInterval: uint64(keepalive / time.Second),
			ConnectRetry: connectRetry, IdleHoldTimeAfterReset: idleHold,
		}},
		Transport: &api.Transport{RemotePort: uint32(p.Port)},
		AfiSafis:  fams,
	}
	if sp.cfg.SourceAddress.IsValid() {
		peer.Transport.LocalAddress = sp.cfg.SourceAddress.String()
	}
	if sp.cfg.Multihop > 0 && p.AS != sp.cfg.LocalAS {
		peer.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(sp.cfg.Multihop)}
	}
	if sp.cfg.GracefulRestart {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(GracefulRestartTime / time.Second)}
		for _, f := range fams {
			f.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
	}
	return peer
}

func family(v4 bool) *api.Family {
	if v4 {
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
}

// hostPath is the host route to addr with med and cfg's communities and
// local preference, next hop this speaker's own address on each session.
func hostPath(addr netip.Addr, med uint32, cfg Config) (*api.Path, error) {
	bits := 32
	if addr.Is6() {
		bits = 128
	}
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: addr.String(), PrefixLen: uint32(bits)})
	if err != nil {
		return nil, err
	}
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0}) // IGP
	if err != nil {
		return nil, err
	}
	m, err := anypb.New(&api.MultiExitDiscAttribute{Med: med})
	if err != nil {
		return nil, err
	}
	attrs := []*anypb.Any{origin, m}
	if len(cfg.Communities) > 0 {
		c, err := anypb.New(&api.CommunitiesAttribute{Communities: cfg.Communities})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, c)
	}
	if cfg.LocalPref > 0 {
		lp, err := anypb.New(&api.LocalPrefAttribute{LocalPref: cfg.LocalPref})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, lp)
	}
	if addr.Is4() {
		// Unspecified: each session's own local address (GoBGP's rule
		// for locally originated routes).
		nh, err := anypb.New(&api.NextHopAttribute{NextHop: "0.0.0.0"})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, nh)
	} else {
		mp, err := anypb.New(&api.MpReachNLRIAttribute{Family: family(false), NextHops: []string{"::"}, Nlris: []*anypb.Any{nlri}})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, mp)
	}
	return &api.Path{Family: family(addr.Is4()), Nlri: nlri, Pattrs: attrs}, nil
}

// Advertise announces a host route to each of addrs with med to every
// peer, replacing what was advertised before.
func (sp *Speaker) Advertise(ctx context.Context, addrs []netip.Addr, med uint32) error {
	if sp.s == nil {
		return errors.New("bgp: speaker not started")
	}
	start := time.Now()
	var paths []*api.Path
	for _, a := range addrs {
		p, err := hostPath(a, med, sp.cfg)
		if err != nil {
			return fmt.Errorf("bgp: route to %s: %w", a, err)
		}
		if _, err := sp.s.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: p}); err != nil {
			return fmt.Errorf("bgp: advertise %s: %w", a, err)
		}
		paths = append(paths, p)
	}
	sp.mu.Lock()
	sp.advertised = paths
	sp.mu.Unlock()
	sp.log.Info("VIP advertised", "routes", len(paths), "med", med, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// Withdraw withdraws every advertised route. It queues the withdrawals on
// every established session before it returns.
func (sp *Speaker) Withdraw(ctx context.Context) error {
	sp.mu.Lock()
	paths := sp.advertised
	sp.advertised = nil
	sp.mu.Unlock()
	if sp.s == nil || len(paths) == 0 {
		return nil
	}
	var errs []error
	for _, p := range paths {
		if err := sp.s.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Path: p}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bgp: withdraw: %w", err)
	}
	sp.log.Info("VIP withdrawn", "routes", len(paths))
	return nil
}

// Advertised tells whether routes are advertised now.
func (sp *Speaker) Advertised() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.advertised) > 0
}

// peerEvent keeps a session's new state and logs the changes that matter:
// up, and down from up.
func (sp *Speaker) peerEvent(r *api.WatchEventResponse) {
	ev := r.GetPeer()
	if ev == nil || ev.Type != api.WatchEventResponse_PeerEvent_STATE || ev.Peer.GetState() == nil {
		return
	}
	addr, st := ev.Peer.State.NeighborAddress, ev.Peer.State.SessionState
	if a, err := netip.ParseAddr(addr); err == nil {
		addr = a.Unmap().String()
	}
	sp.mu.Lock()
	was, known := sp.states[addr]
	if known {
		sp.states[addr] = st
	}
	sp.mu.Unlock()
	switch {
	case !known || was == st:
	case st == api.PeerState_ESTABLISHED:
		sp.log.Info("BGP session established", "peer", addr)
	case was == api.PeerState_ESTABLISHED:
		sp.log.Warn("BGP session down", "peer", addr, "state", strings.ToLower(st.String()))
	}
}

// Settings reports the timers and route policy the speaker runs with.
func (sp *Speaker) Settings() Settings { return sp.cfg.Settings() }

// Peers reports each session's state, in --bgp-peer order.
func (sp *Speaker) Peers(context.Context) []PeerState {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out []PeerState
	for _, p := range sp.cfg.Peers {
		st, ok := sp.states[p.Address.String()]
		if !ok {
			continue // not started
		}
		ps := PeerState{
			Peer:        fmt.Sprintf("%s,%d", p.Address, p.AS),
			State:       strings.ToLower(st.String()),
			Established: st == api.PeerState_ESTABLISHED,
		}
		if s := sp.bfdSessions[p.Address]; s != nil {
			b := s.Status()
			ps.BFD = b.State
			if !b.Up {
				// The path to the router is in doubt: a route over
				// it may reach nobody.
				ps.Established = false
			}
		}
		out = append(out, ps)
	}
	return out
}

// Close ends every session with a CEASE notification, so routers drop this
// node's routes at once, and stops the speaker. Safe to call twice.
func (sp *Speaker) Close() {
	sp.mu.Lock()
	m := sp.bfd
	sp.bfd = nil
	sp.mu.Unlock()
	if m != nil {
		m.Close()
	}
	if sp.s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := sp.s.StopBgp(ctx, &api.StopBgpRequest{}); err != nil {
		sp.log.Warn("BGP speaker did not stop cleanly", "err", err)
	}
	sp.s.Stop()
	sp.s = nil
}

// logger passes GoBGP's log lines to slog, one level quieter: GoBGP logs
// every session state change at info, which vigil reports itself.
type logger struct {
	log   *slog.Logger
	level gobgplog.LogLevel
}

func (l *logger) emit(lv slog.Level, msg string, f gobgplog.Fields) {
	if !l.log.Enabled(context.Background(), lv) {
		return
	}
	args := make([]any, 0, 2*len(f))
	for k, v := range f {
		args = append(args, k, v)
	}
	l.log.Log(context.Background(), lv, msg, args...)
}

func (l *logger) Panic(msg string, f gobgplog.Fields) { l.emit(slog.LevelError, msg, f) }
func (l *logger) Fatal(msg string, f gobgplog.Fields) { l.emit(slog.LevelError, msg, f) }
func (l *logger) Error(msg string, f gobgplog.Fields) { l.emit(slog.LevelWarn, msg, f) }
func (l *logger) Warn(msg string, f gobgplog.Fields)  { l.emit(slog.LevelWarn, msg, f) }
func (l *logger) Info(msg string, f gobgplog.Fields)  { l.emit(slog.LevelDebug, msg, f) }
func (l *logger) Debug(msg string, f gobgplog.Fields) {}
func (l *logger) SetLevel(level gobgplog.LogLevel)    { l.level = level }
func (l *logger) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }

// Eligible tells why this node cannot announce the VIP now: no session is
// established, so a route it advertised would reach no router. A node
// without one does not campaign, and a holder that loses its last one
// steps down, so a peer whose sessions are up takes the VIP.
func (sp *Speaker) Eligible(ctx context.Context) error {
	ps := sp.Peers(ctx)
	for _, p := range ps {
		if p.Established {
			return nil
		}
	}
	var states []string
	bfdOnly := false
	for _, p := range ps {
		st := p.Peer + " " + p.State
		if p.BFD != "" {
			st += ", BFD " + p.BFD
			bfdOnly = bfdOnly || p.State == "established"
		}
		states = append(states, st)
	}
	if bfdOnly {
		return fmt.Errorf("no BGP session is established with its BFD session up (%s): does the router run BFD for this node (BIRD: bfd on; FRR: neighbor ADDRESS bfd)?", strings.Join(states, ", "))
	}
	return fmt.Errorf("no BGP session is established (%s)", strings.Join(states, ", "))
}
