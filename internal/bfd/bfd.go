// Package bfd runs Bidirectional Forwarding Detection (RFC 5880) sessions
// to directly connected routers, over UDP (RFC 5881, single hop), in
// asynchronous mode: each side sends control packets every interval, and
// declares the other down when none arrived for the detection time
// (multiplier x interval). A router that ties its BGP session to BFD then
// drops a dead node's session, and its routes, within that time instead of
// the BGP hold time.
//
// GoBGP, vigil's BGP library, has no BFD, so this is vigil's own: the
// mandatory part of the protocol (no authentication, no demand mode, no
// echo function), enough for a router's BFD to keep a session Up with
// vigil and to see it go when vigil dies. docs/bgp.md has how it was tested
// against BIRD.
package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// State is a session's state (RFC 5880, 4.1).
type State uint8

const (
	AdminDown State = 0
	Down      State = 1
	Init      State = 2
	Up        State = 3
)

func (s State) String() string {
	switch s {
	case AdminDown:
		return "admindown"
	case Down:
		return "down"
	case Init:
		return "init"
	case Up:
		return "up"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Diag is a diagnostic code: why the session last left Up.
type Diag uint8

const (
	DiagNone             Diag = 0
	DiagDetectionExpired Diag = 1 // no control packet within the detection time
	DiagNeighborDown     Diag = 3 // the neighbour said its session went down
	DiagAdminDown        Diag = 7 // this side stopped the session
)

func (d Diag) String() string {
	switch d {
	case DiagNone:
		return "none"
	case DiagDetectionExpired:
		return "control detection time expired"
	case DiagNeighborDown:
		return "neighbor signaled session down"
	case DiagAdminDown:
		return "administratively down"
	}
	return fmt.Sprintf("diag(%d)", uint8(d))
}

// packetLen is the length of a control packet without authentication.
const packetLen = 24

// Packet is a BFD control packet (RFC 5880, 4.1), without authentication.
type Packet struct {
	Diag       Diag
	State      State
	Poll       bool
	Final      bool
	DetectMult uint8
	MyDisc     uint32
	YourDisc   uint32
	// Intervals in microseconds.
	DesiredMinTx  uint32
	RequiredMinRx uint32
}

// Marshal encodes p.
func (p Packet) Marshal() []byte {
	b := make([]byte, packetLen)
	b[0] = 1<<5 | byte(p.Diag)&0x1f // version 1
	b[1] = byte(p.State) << 6
	if p.Poll {
		b[1] |= 0x20
	}
	if p.Final {
		b[1] |= 0x10
	}
	b[2] = p.DetectMult
	b[3] = packetLen
	binary.BigEndian.PutUint32(b[4:], p.MyDisc)
	binary.BigEndian.PutUint32(b[8:], p.YourDisc)
	binary.BigEndian.PutUint32(b[12:], p.DesiredMinTx)
	binary.BigEndian.PutUint32(b[16:], p.RequiredMinRx)
	// Required Min Echo RX Interval: 0, no echo function.
	return b
}

// ErrBadPacket is wrapped by every reason a received packet is discarded.
var ErrBadPacket = errors.New("bfd: packet discarded")

// Parse decodes and checks a received control packet as RFC 5880 6.8.6
// asks (the checks that do not need the session).
func Parse(b []byte) (Packet, error) {
	bad := func(why string) (Packet, error) { return Packet{}, fmt.Errorf("%w: %s", ErrBadPacket, why) }
	if len(b) < packetLen {
		return bad("shorter than 24 bytes")
	}
	if v := b[0] >> 5; v != 1 {
		return bad(fmt.Sprintf("version %d", v))
	}
	n := int(b[3])
	if n < packetLen || n > len(b) {
		return bad(fmt.Sprintf("length field %d", n))
	}
	if b[1]&0x04 != 0 {
		return bad("authentication, which vigil does not configure")
	}
	if b[1]&0x01 != 0 {
		return bad("multipoint bit set")
	}
	p := Packet{
		Diag:          Diag(b[0] & 0x1f),
		State:         State(b[1] >> 6),
		Poll:          b[1]&0x20 != 0,
		Final:         b[1]&0x10 != 0,
		DetectMult:    b[2],
		MyDisc:        binary.BigEndian.Uint32(b[4:]),
		YourDisc:      binary.BigEndian.Uint32(b[8:]),
		DesiredMinTx:  binary.BigEndian.Uint32(b[12:]),
		RequiredMinRx: binary.BigEndian.Uint32(b[16:]),
	}
	switch {
	case p.DetectMult == 0:
		return bad("detect multiplier 0")
	case p.MyDisc == 0:
		return bad("my discriminator 0")
	case p.YourDisc == 0 && p.State != Down && p.State != AdminDown:
		return bad("your discriminator 0 in state " + p.State.String())
	case p.Poll && p.Final:
		return bad("poll and final both set")
	}
	return p, nil
}
