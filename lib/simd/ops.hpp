// The per-instruction-set primitives the kernels in kernels_impl.hpp are written over. xsimd covers the
// float arithmetic; what it does not cover (int8 block packing, nibbles, int8 dot products, fp16
// conversion) each instruction set provides in its own ops_<isa>.hpp as a specialization of Ops<Arch>:
//
//   F, I, DotArch        batch<float, Arch>, batch<int32_t, Arch>, the arch of dot()'s int32 result
//   Bytes                one 32-value block as int8 (registers)
//   reduce_add_rows(F[], count, out)   out[k] = the sum of the lanes of row k (a transposing sum)
//   hmax(F)              largest lane; hmax_all(F) (where present) the same in every lane
//   to_i32(F), to_f32(I) C conversions: float -> int truncates, int -> float rounds
//   low_bytes(I[32/N])   the low byte of each int32 (C's int -> int8_t), as a block
//   pack_small(I[32/N])  the same, for values known to lie in -128..127 (cheaper where packs saturate)
//   widen(Bytes, F[32/N]) the block's values as floats; widen_pair(Bytes, p, F[2]) values 2Np..2Np+2N-1
//   load_q8, load_nibbles, add_high_bits, sub, min, store, store_nibbles, bit4_mask   block layouts
//   load_iq4_nl(qs)      an iq4_nl block's nibbles (load_nibbles' order) looked up in its 16 levels
//   key(Bytes), dot(Key, y)   int32 partial sums of an int8 block times 32 int8 query values
//   dot4_signed, dot4_unsigned(key, y[4])   four queries' sums: lanes l with l mod 4 = i add up to query i's
//   kBlockPairs: load_nibble_pair, dot4_pair, store_half_sums4, f16_pair   two q4 blocks per register
//   f16_value(uint16_t)  scalar fp16, bit-identical to lib/ref/half.hpp
//   load_f16, store_f16, load_u16, store_u16   plain-codec rows
//
// Each contract is checked at run time, at every level, by ops_check.hpp (before the level is used, and by
// tests/test_simd_selfcheck.cpp), with inputs whose every lane differs.
//
// Everything here lives in an unnamed namespace: each level's file gets its own copy compiled with its
// own flags, and no symbol compiled with AVX2 can be picked by the linker for code that must run without.
#pragma once

#include "xsimd_compat.hpp"

namespace kvq::simd {
namespace {

template <class Arch>
struct Ops;

}  // namespace
}  // namespace kvq::simd
