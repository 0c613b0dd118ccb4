package bfd

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/validate"
)

func TestPacketRoundTrip(t *testing.T) {
	for _, p := range []Packet{
		{State: Down, DetectMult: 3, MyDisc: 1, DesiredMinTx: 1_000_000, RequiredMinRx: 300_000},
		{Diag: DiagDetectionExpired, State: Up, Poll: true, DetectMult: 255, MyDisc: 0xFFFFFFFF, YourDisc: 7, DesiredMinTx: 50_000, RequiredMinRx: 50_000},
		{Diag: DiagAdminDown, State: AdminDown, Final: true, DetectMult: 1, MyDisc: 9},
	} {
		b := p.Marshal()
		if len(b) != 24 || b[0]>>5 != 1 || b[3] != 24 {
			t.Fatalf("Marshal(%+v) = %x: want 24 bytes, version 1", p, b)
		}
		got, err := Parse(b)
		if err != nil || got != p {
			t.Fatalf("Parse(Marshal(%+v)) = %+v, %v", p, got, err)
		}
	}
}

// A packet RFC 5880 6.8.6 says to discard is refused, with the reason.
func TestParseDiscards(t *testing.T) {
	good := Packet{State: Up, DetectMult: 3, MyDisc: 1, YourDisc: 2, DesiredMinTx: 1, RequiredMinRx: 1}.Marshal()
	for want, mutate := range map[string]func(b []byte) []byte{
		"shorter":        func(b []byte) []byte { return b[:23] },
		"version 2":      func(b []byte) []byte { b[0] = 2<<5 | b[0]&0x1f; return b },
		"length field 2": func(b []byte) []byte { b[3] = 20; return b },
		"length field 3": func(b []byte) []byte { b[3] = 30; return b },
		"authentication": func(b []byte) []byte { b[1] |= 0x04; return b },
		"multipoint":     func(b []byte) []byte { b[1] |= 0x01; return b },
		"multiplier 0":   func(b []byte) []byte { b[2] = 0; return b },
		"my discrimin":   func(b []byte) []byte { copy(b[4:8], []byte{0, 0, 0, 0}); return b },
		"your discrimin": func(b []byte) []byte { copy(b[8:12], []byte{0, 0, 0, 0}); return b }, // in state Up
		"poll and final": func(b []byte) []byte { b[1] |= 0x30; return b },
	} {
		b := mutate(append([]byte(nil), good...))
		_, err := Parse(b)
		if err == nil || !errors.Is(err, ErrBadPacket) || !strings.Contains(err.Error(), strings.Fields(want)[0]) {
			t.Errorf("%s: Parse = %v, want it discarded", want, err)
		}
	}
	// Your discriminator 0 is fine while the sender is Down: it has not
	// heard from us yet.
	down := Packet{State: Down, DetectMult: 3, MyDisc: 1}.Marshal()
	if _, err := Parse(down); err != nil {
		t.Fatalf("a first packet: %v", err)
	}
}

func TestValidateTimers(t *testing.T) {
	if err := ValidateTimers(100*time.Millisecond, 3); err != nil {
		t.Fatal(err)
	}
	for want, tc := range map[string]struct {
		iv   time.Duration
		mult uint8
	}{
		"`bgpBfdInterval` 10ms": {10 * time.Millisecond, 3},
		"`bgpBfdInterval` 2m0s": {2 * time.Minute, 3},
		"microseconds":          {100*time.Millisecond + 1, 3},
		"`bgpBfdMultiplier` 0":  {100 * time.Millisecond, 0},
	} {
		if err := ValidateTimers(tc.iv, tc.mult); err == nil || !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: ValidateTimers = %v", want, err)
		}
	}
}
