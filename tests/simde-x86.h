// tests/simde-x86.h - the x86 intrinsics of cpu/host_experts.cpp from SIMDe (libsimde-dev), for
// test-host-experts-simde: the AVX2 and AVX-512 paths run, emulated, on CPUs without them (CI).
// Adds the two intrinsics that older SIMDe releases (Debian 12's 0.7.4) lack, in the all-lanes
// maskz form the kernel uses.
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>

#ifndef _mm512_maskz_cvtepu8_epi32
inline __m512i gptoss_simde_cvtepu8_epi32(__m128i a) {
    alignas(16) uint8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), a);
    alignas(64) int32_t dwords[16];
    for (int i = 0; i < 16; i++) dwords[i] = bytes[i];
    return _mm512_load_si512(dwords);
}
#define _mm512_maskz_cvtepu8_epi32(k, a) ((void)(k), gptoss_simde_cvtepu8_epi32(a))
#endif
#ifndef _mm512_maskz_srli_epi32
#define _mm512_maskz_srli_epi32(k, a, n) ((void)(k), _mm512_srli_epi32(a, n))
#endif
