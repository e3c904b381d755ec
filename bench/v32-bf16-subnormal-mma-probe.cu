// bench/v32-bf16-subnormal-mma-probe.cu - does mma.sync m16n8k16 (bf16 in, fp32 out) take bf16 subnormal A inputs
// exactly? A holds e2m1 values placed as q * 2^-126 (the e2m1_word_bits bit positions: e = 0 values are
// subnormal), B activations scaled by 2^S; compared with the exact double sum, and with plain bf16 q.
// Build and run on the GPU machine: nvcc -arch=sm_90a -O2 -o /tmp/subn bench/v32-bf16-subnormal-mma-probe.cu && /tmp/subn
// (bench/NOTES.md "v32": H200, every S: the same 1.2e-7 relative error as plain bf16, no row off).
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
__global__ void k(const uint16_t* A, const uint16_t* B, float* D) {
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  auto a16 = [&](int r, int c) { return (uint32_t)A[r * 16 + c]; };
  auto b16 = [&](int kk, int n) { return (uint32_t)B[n * 16 + kk]; };
  uint32_t a[4], b[2];
  a[0] = a16(g, 2*t) | a16(g, 2*t+1) << 16;
  a[1] = a16(g+8, 2*t) | a16(g+8, 2*t+1) << 16;
  a[2] = a16(g, 2*t+8) | a16(g, 2*t+9) << 16;
  a[3] = a16(g+8, 2*t+8) | a16(g+8, 2*t+9) << 16;
  b[0] = b16(2*t, g) | b16(2*t+1, g) << 16;
  b[1] = b16(2*t+8, g) | b16(2*t+9, g) << 16;
  float c[4] = {0, 0, 0, 0};
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  D[g * 8 + 2*t] = c[0]; D[g * 8 + 2*t+1] = c[1]; D[(g+8) * 8 + 2*t] = c[2]; D[(g+8) * 8 + 2*t+1] = c[3];
}
static float bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); return u >> 16; }  // exact inputs only
int main() {
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  uint16_t *A, *B; float* D;
  cudaMallocManaged(&A, 512); cudaMallocManaged(&B, 256); cudaMallocManaged(&D, 512);
  srand(7);
  for (int S : {0, 16, 32, 64, 100}) for (int norm = 0; norm < 2; ++norm) {
    double maxrel = 0; int flushed = 0;
    for (int trial = 0; trial < 200; ++trial) {
      float q[256]; double xb[128];
      for (int i = 0; i < 256; ++i) {
        int nib = rand() & 15; q[i] = (nib & 8 ? -1 : 1) * e2m1[nib & 7];
        if (trial < 20 && rand() % 4) q[i] = (rand() & 1) ? 0.5f : -0.5f;  // many subnormals
        // placed: sign at 15, e1 e0 m at bits 8..6  -> q * 2^-126; norm: plain bf16 q
        uint16_t placed = (uint16_t)((nib & 8) << 12 | (nib & 7) << 6);
        if (trial < 20) placed = q[i] == 0 ? 0 : (uint16_t)((q[i] < 0 ? 0x8000 : 0) | (fabsf(q[i]) == 0.5f ? 1 << 6 : 0));
        if (trial < 20 && fabsf(q[i]) != 0.5f && q[i] != 0) placed = 0, q[i] = 0;
        A[i] = norm ? tobf(q[i]) : placed;
      }
      for (int i = 0; i < 128; ++i) {
        float x = ldexpf((float)((rand() % 255) - 127) / 64.0f, (rand() % 21) - 10);
        x = bf(tobf(x)); xb[i] = x;
        B[i] = tobf(ldexpf(x, norm ? 0 : S));
      }
      k<<<1, 32>>>(A, B, D); cudaDeviceSynchronize();
      for (int r = 0; r < 16; ++r) for (int n = 0; n < 8; ++n) {
        double exact = 0, mag = 0;
        for (int kk = 0; kk < 16; ++kk) { exact += (double)q[r * 16 + kk] * xb[n * 16 + kk]; mag += fabs((double)q[r * 16 + kk] * xb[n * 16 + kk]); }
        double got = norm ? D[r * 8 + n] : ldexp((double)D[r * 8 + n], 126 - S);
        if (mag > 0) { double rel = fabs(got - exact) / mag; if (rel > maxrel) maxrel = rel; if (rel > 1e-3) ++flushed; }
      }
    }
    printf("S=%3d %s: max |err|/sum|terms| = %.3g, rows off by >1e-3: %d\n", S, norm ? "plain bf16 q  " : "q*2^-126 placed", maxrel, flushed);
  }
  return 0;
}
