// The product of a few rows, x (M, K) @ w.T, w (N, K) row-major, streaming w once.
//
// A decode step (M = 1) or speculative decoding's check of k guesses (M = k + 1) reads
// every weight once and does M multiply-adds with it: at M of a few, the time is the
// read of w, if each loaded weight is used by all M rows while it is in a register.
// This kernel does that (rows.py explains where it runs):
//
// * blocking: NB = 4 outputs (rows of w) at a time, for up to R = 6 rows of x: each step
//   loads 16 weights of each of the 4 outputs once (4 vectors) and 16 activations of each
//   row (R vectors), and does 4 * R fused multiply-adds, accumulated in R * 4 registers
//   (at most 24 of the 32 AVX-512 registers, the 4 + 1 loaded vectors besides). More than
//   6 rows are done in balanced chunks (9 = 5 + 4): the 4 weight rows of a block (4 K
//   values) are then read again from the L1/L2 cache, not from memory;
// * weights at their bytes: float32 (4 bytes), bfloat16 (2: the 16 bits shifted into a
//   float32's high half, which is exactly the bfloat16's value) or int8 (1: widened to
//   int32, then converted to float32, exact for -128..127), with one scale an output
//   applied after the sum, as quant.py's int8 defines it, w[o] = q[o] * scale[o];
// * numerics: every product and sum in float32, whatever the weights' bytes (as a
//   bfloat16 GEMM accumulates in float32): 16 partial sums a lane, added in a tree at
//   the end, so the error is within K * 2^-24 of sum |x_k w_k| (the bound the tests use),
//   like any float32 dot product, but in another order than the library GEMM's;
// * tails: K not a multiple of 16 is read under a mask (zeros past the end), an N not a
//   multiple of 4 ends with blocks of one output.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

namespace {

constexpr int NB = 4;    // outputs a block
constexpr int RMAX = 6;  // rows of x a block: 24 accumulators

inline __m512 widen(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

inline __m512 widen(const at::BFloat16* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);  // 16 x 16 bits
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512 widen(const int8_t* p, __mmask16 m) {
  __m128i b = _mm_maskz_loadu_epi8(m, p);  // 16 x 8 bits
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

// acc[r][j] += x[r, k:k+16] * w[n0 + j, k:k+16], the lanes past K masked off (zeros).
template <int R, int J, typename W>
inline void fma_step(__m512 (&acc)[R][J], const float* x, const W* const (&wr)[J], int64_t K,
                     int64_t k, __mmask16 m) {
  __m512 wv[J];
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) {
    wv[j] = widen(wr[j] + k, m);  // each weight loaded once
    // The same weights of the next block's rows, J rows on, asked for now: a block reads J
    // short rows at once (a row of K = 576 floats is 36 cache lines), too short a stream for
    // the hardware's prefetcher to find before it ends.
    _mm_prefetch(reinterpret_cast<const char*>(wr[j] + k + J * K), _MM_HINT_T0);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m512 xv = _mm512_maskz_loadu_ps(m, x + r * K + k);
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
  }
}

// y[r, n0 + j] for r < R, j < J: x (R, K) float32, w rows n0.. of K weights each.
template <int R, int J, typename W>
void block(const float* x, const W* w, int64_t K, int64_t n0, float* y, int64_t N,
           const float* scale) {
  __m512 acc[R][J];
  const W* wr[J];
  // Every loop over the registers unrolled (GCC keeps an array of vectors in registers
  // only where each index is a constant).
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) wr[j] = w + (n0 + j) * K;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) fma_step<R, J>(acc, x, wr, K, k, __mmask16(0xFFFF));
  if (k < K) fma_step<R, J>(acc, x, wr, K, k, __mmask16((1u << (K - k)) - 1));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      float s = _mm512_reduce_add_ps(acc[r][j]);
      y[r * N + n0 + j] = scale ? s * scale[n0 + j] : s;
    }
}

template <int R, typename W>
void rows_of(const float* x, const W* w, int64_t K, int64_t begin, int64_t end, float* y,
             int64_t N, const float* scale) {
  int64_t n = begin;
  for (; n + NB <= end; n += NB) block<R, NB>(x, w, K, n, y, N, scale);
  for (; n < end; ++n) block<R, 1>(x, w, K, n, y, N, scale);
}

template <typename W>
void chunk(int rows, const float* x, const W* w, int64_t K, int64_t b, int64_t e, float* y,
           int64_t N, const float* s) {
  switch (rows) {
    case 1: return rows_of<1>(x, w, K, b, e, y, N, s);
    case 2: return rows_of<2>(x, w, K, b, e, y, N, s);
    case 3: return rows_of<3>(x, w, K, b, e, y, N, s);
    case 4: return rows_of<4>(x, w, K, b, e, y, N, s);
    case 5: return rows_of<5>(x, w, K, b, e, y, N, s);
    default: return rows_of<6>(x, w, K, b, e, y, N, s);
  }
}

// Outputs [begin, end) of every row: the rows in balanced chunks of at most RMAX, each
// chunk over the same 64 outputs before the next 64, so a chunk after the first reads the
// weights from the cache.
template <typename W>
void product(const float* x, const W* w, int64_t M, int64_t K, int64_t begin, int64_t end,
             float* y, int64_t N, const float* scale) {
  const int64_t chunks = (M + RMAX - 1) / RMAX, step = 64;
  for (int64_t b = begin; b < end; b += step) {
    int64_t e = std::min(end, b + step), r0 = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t rows = (M - r0) / (chunks - c);  // balanced: 9 -> 4 + 5
      chunk<W>(int(rows), x + r0 * K, w, K, b, e, y + r0 * N, N, scale);
      r0 += rows;
    }
  }
}

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& w,
                       const std::optional<at::Tensor>& scale) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "rows_linear: x (M, K) and w (N, K), got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rows_linear: CPU tensors");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous();  // (M, K): the activations in float32
  at::Tensor wc = w.contiguous();                 // (N, K): a no-op for the model's own
  at::Tensor sf;
  if (w.scalar_type() == at::kChar) {
    TORCH_CHECK(scale.has_value() && scale->numel() == N, "rows_linear: int8 needs scale (N,)");
    sf = scale->to(at::kFloat).contiguous();  // (N,)
  }
  at::Tensor y = at::empty({M, N}, xf.options());  // (M, N) float32
  const float* xp = xf.data_ptr<float>();
  const float* sp = sf.defined() ? sf.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Threads split the outputs (each thread streams its own rows of w); one thread runs the
  // range directly.
  at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
    switch (wc.scalar_type()) {
      case at::kFloat: return product(xp, wc.data_ptr<float>(), M, K, begin, end, yp, N, sp);
      case at::kBFloat16:
        return product(xp, wc.data_ptr<at::BFloat16>(), M, K, begin, end, yp, N, sp);
      case at::kChar: return product(xp, wc.data_ptr<int8_t>(), M, K, begin, end, yp, N, sp);
      default: TORCH_CHECK(false, "rows_linear: weights float32, bfloat16 or int8, got ",
                           wc.scalar_type());
    }
  });
  return y.to(x.scalar_type());  // one rounding, at the end, to the activations' dtype
}

}  // namespace

TORCH_LIBRARY(ladder_rows, m) {
  m.def("rows_linear(Tensor x, Tensor w, Tensor? scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(ladder_rows, CPU, m) { m.impl("rows_linear", &rows_linear); }
