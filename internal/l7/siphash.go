package l7

import "math/bits"

// HashKey keys the hashes the in-kernel reader and the rules meet as
// (SipHash-2-4): a node's secret, so nobody who cannot read it can
// compute a path whose hash equals an allowed one's.
type HashKey [2]uint64

// sipState is SipHash-2-4 fed one byte at a time, as bpf/lib/siphash.h
// feeds it: sum gives the hash of what was written so far.
type sipState struct {
	v0, v1, v2, v3, m uint64
	n                 uint8 // bytes written, modulo 256
}

func newSip(k HashKey) sipState {
	return sipState{v0: k[0] ^ 0x736f6d6570736575, v1: k[1] ^ 0x646f72616e646f6d,
		v2: k[0] ^ 0x6c7967656e657261, v3: k[1] ^ 0x7465646279746573}
}

func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13) ^ v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16) ^ v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21) ^ v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17) ^ v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

func (s *sipState) write(c byte) {
	s.m |= uint64(c) << ((s.n & 7) * 8)
	s.n++
	if s.n&7 != 0 {
		return
	}
	v0, v1, v2, v3 := s.v0, s.v1, s.v2, s.v3^s.m
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	s.v0, s.v1, s.v2, s.v3, s.m = v0^s.m, v1, v2, v3, 0
}

func (s *sipState) writeString(str string) {
	for i := 0; i < len(str); i++ {
		s.write(str[i])
	}
}

func (s sipState) sum() uint64 {
	b := uint64(s.n)<<56 | s.m
	v0, v1, v2, v3 := s.v0, s.v1, s.v2, s.v3^b
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= b
	v2 ^= 0xff
	for i := 0; i < 4; i++ {
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	}
	return v0 ^ v1 ^ v2 ^ v3
}

func sipString(k HashKey, str string) uint64 {
	s := newSip(k)
	s.writeString(str)
	return s.sum()
}
