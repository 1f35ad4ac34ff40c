"""C++ CPU kernels, built on demand (`train.cpp_kernels`).

Three kernels. The table gradient of `nets.gather_sum` (the one-hot layers of
`train.onehot_gather`), table_grad[idx[r, g]] += grad[r] over rows r and groups g. ATen has
no single call for it: `index_add_` per group passes over the (rows, units) gradient once per
group and sorts each group's indices, 5.6 ms at 15,360 rows x 16 groups x 64 units on 2
threads, where one pass adding each gradient row into a table that stays in cache takes
0.8 ms (docs/performance.md). Each thread adds its share of the rows into its own table, and
the tables are summed in thread order: the same result for the same number of threads.

And the softmax and two-hot mean of the 255-bin heads' logits without gradient
(`nets.twohot_softmax_mean`: the reward and the slow critic over the imagined states, and the
critic's values with the probabilities its loss reuses): one pass over each row, which stays
in cache, with an AVX2 exp (Cephes' polynomial, ~1 ulp). ATen's and inductor's kernels pass
over the (rows, 256) logits several times: 5.3 ms compiled against 1.7 ms for 15,360 rows.

And the imagined latents' samples (`nets.unimix_index`): softmax, unimix, cumulative sum and
the inverse-CDF search of each (row, group) in one pass, where ATen runs five kernels.

The source is compiled by torch's extension builder (`torch.utils.cpp_extension`, a C++
compiler as `train.compile` needs) once per machine and source, ~40 s, and cached on disk
(`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions)."""

from __future__ import annotations

import logging
import sys

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// One copy of the loop per instruction set, picked at run time (GCC on x86-64): AVX2 halves
// the time of the SSE2 baseline, and the build stays right for every x86-64 CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static bool add_rows(const float* grad, const int64_t* idx, float* table, int64_t r0,
                     int64_t r1, int64_t groups, int64_t units, int64_t table_rows) {
  bool ok = true;  // false: an index outside the table, skipped (the caller raises)
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = grad + r * units;
    for (int64_t g = 0; g < groups; ++g) {
      const uint64_t k = (uint64_t)idx[r * groups + g];
      if (k >= (uint64_t)table_rows) { ok = false; continue; }
      float* __restrict__ dst = table + k * units;
      for (int64_t u = 0; u < units; ++u) dst[u] += src[u];
    }
  }
  return ok;
}

// table_grad[idx[r, g]] += grad[r]: idx (rows, groups) int64 in [0, table_rows), grad
// (rows, units) float32. Each thread adds its share of the rows into its own table.
torch::Tensor table_grad(torch::Tensor idx, torch::Tensor grad, int64_t table_rows) {
  TORCH_CHECK(idx.dim() == 2 && grad.dim() == 2 && idx.size(0) == grad.size(0),
              "table_grad: idx (rows, groups) and grad (rows, units) must share rows");
  TORCH_CHECK(idx.scalar_type() == torch::kLong && grad.scalar_type() == torch::kFloat,
              "table_grad: idx must be int64 and grad float32");
  idx = idx.contiguous();
  grad = grad.contiguous();
  const int64_t rows = grad.size(0), units = grad.size(1), groups = idx.size(1);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows / 256));
  auto tables = torch::zeros({parts, table_rows, units}, grad.options());
  const float* g = grad.data_ptr<float>();
  const int64_t* ix = idx.data_ptr<int64_t>();
  float* t = tables.data_ptr<float>();
  std::vector<char> ok(parts, 1);
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      ok[p] = add_rows(g, ix, t + p * table_rows * units, rows * p / parts,
                       rows * (p + 1) / parts, groups, units, table_rows);
  });
  for (int64_t p = 0; p < parts; ++p)
    TORCH_CHECK(ok[p], "table_grad: an index outside [0, ", table_rows, ")");
  if (parts == 1) return tables[0];
  auto out = tables[0].clone();
  for (int64_t p = 1; p < parts; ++p) out.add_(tables[p]);  // in thread order
  return out;
}

// ---------------------------------------------------------------- two-hot softmax and mean
// Per row of logits (width >= n bins; extra columns -inf): e = exp(l - max l), s = sum e,
// probs = e / s, and the mean in symlog space sum_{j<m} (e[m+1+j] - e[m-1-j]) bins[m+1+j] / s
// over bins symmetric about bins[m] = 0 (TwoHot.mean_of's pairwise sum: equal logits give
// exactly 0). One pass over each row, which stays in cache, instead of separate passes for
// the max, the exponentials, the normalisation and the mean.

// Off: the portable loops below even where the CPU has AVX2 and FMA (tests run both).
static bool simd = true;

bool set_simd(bool on) {
  const bool before = simd;
  simd = on;
  return before;
}

static inline float exp_scalar(float x) { return x < -87.33654f ? 0.0f : std::exp(x); }

// A row with a NaN or with an infinite max gets NaN, as softmax gives (never a silent 0).
static void bad_row(float* probs, float* mean, int64_t r, int64_t width) {
  mean[r] = NAN;
  if (probs) for (int64_t k = 0; k < width; ++k) probs[r * width + k] = NAN;
}

// The max of a row's logits l[k0..n) folded into mx; false when the row holds a NaN or its
// max is infinite: softmax's probabilities are then all NaN.
static inline bool row_max(const float* l, int64_t k0, int64_t n, float& mx) {
  bool nan = false;
  for (int64_t k = k0; k < n; ++k) { mx = l[k] > mx ? l[k] : mx; nan |= l[k] != l[k]; }
  return !nan && std::isfinite(mx);
}

static void rows_twohot(const float* logits, const float* bins, float* probs, float* mean,
                        float* e, int64_t r0, int64_t r1, int64_t width, int64_t n) {
  const int64_t m = n / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* l = logits + r * width;
    float mx = l[0];
    if (!row_max(l, 0, width, mx)) { bad_row(probs, mean, r, width); continue; }
    float s = 0.0f;
    for (int64_t k = 0; k < width; ++k) { e[k] = exp_scalar(l[k] - mx); s += e[k]; }
    float acc = 0.0f;
    for (int64_t j = 0; j < m; ++j) acc += (e[m + 1 + j] - e[m - 1 - j]) * bins[m + 1 + j];
    mean[r] = acc / s;
    if (probs) for (int64_t k = 0; k < width; ++k) probs[r * width + k] = e[k] / s;
  }
}

// ---------------------------------------------------------------- categorical samples
// idx[r] = the number of classes k whose cumulative probability sum_{i<=k} p_i is below
// u[r], at most K - 1, with p = (1 - a) softmax(l_r) + a / K: nets.categorical_index of
// nets.unimix_probs (the cumulative sums in double, rounded to float, as ATen's cumsum).
static int64_t cdf_search(const float* p, float u, int64_t K) {
  double acc = 0.0;
  for (int64_t k = 0; k < K - 1; ++k) {
    acc += (double)p[k];
    if (!((float)acc < u)) return k;
  }
  return K - 1;
}

static int64_t inverse_cdf(float* e, float s, float u, int64_t K, float a) {
  const float keep = 1.0f - a, mix = a / (float)K;
  for (int64_t k = 0; k < K; ++k) e[k] = e[k] / s * keep + mix;
  return cdf_search(e, u, K);
}

static void rows_sample(const float* logits, const float* u, int64_t* idx, float* e,
                        int64_t r0, int64_t r1, int64_t K, float a) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* l = logits + r * K;
    float mx = l[0];
    // A NaN logit or an infinite max: ATen's inverse CDF (searchsorted, clamped) of the NaN
    // probabilities gives the last class.
    if (!row_max(l, 0, K, mx)) { idx[r] = K - 1; continue; }
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) { e[k] = exp_scalar(l[k] - mx); s += e[k]; }
    idx[r] = inverse_cdf(e, s, u[r], K, a);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LUCID_AVX2 __attribute__((target("avx2,fma")))

// exp(x) for x <= 0 (a logit minus its row's max), 8 at a time: Cephes' expf (x = n ln 2 + r,
// degree-5 polynomial in r, ~1 ulp), and 0 below -87.3, where float exp leaves the normal
// range (ATen's gives denormals there: < 1.2e-38, nothing a mean or a loss can see).
LUCID_AVX2 static inline __m256 exp8_nonpos(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 xc = _mm256_max_ps(x, lo);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(pow2)));
}

LUCID_AVX2 static inline float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

LUCID_AVX2 static inline float hmax8(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// row_max over a whole row, 8 logits at a time and the tail as row_max.
LUCID_AVX2 static inline bool row_max_avx2(const float* l, int64_t n, float& mx) {
  const int64_t n8 = n / 8 * 8;
  __m256 vmax = _mm256_set1_ps(-INFINITY), vnan = _mm256_setzero_ps();
  for (int64_t k = 0; k < n8; k += 8) {
    const __m256 v = _mm256_loadu_ps(l + k);
    vmax = _mm256_max_ps(vmax, v);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  mx = hmax8(vmax);
  const bool ok = row_max(l, n8, n, mx);
  return ok && _mm256_movemask_ps(vnan) == 0;
}

// e = exp(l - mx) over a row, returning sum e.
LUCID_AVX2 static inline float exp_row_avx2(const float* l, float mx, float* e, int64_t width) {
  const int64_t w8 = width / 8 * 8;
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 vs = _mm256_setzero_ps();
  for (int64_t k = 0; k < w8; k += 8) {
    const __m256 v = exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(l + k), vm));
    _mm256_storeu_ps(e + k, v);
    vs = _mm256_add_ps(vs, v);
  }
  float s = hsum8(vs);
  for (int64_t k = w8; k < width; ++k) { e[k] = exp_scalar(l[k] - mx); s += e[k]; }
  return s;
}

// The AVX2 loops where the CPU has AVX2 and FMA, unless set_simd(false) asked for the others.
static bool use_avx2() {
  return simd && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

LUCID_AVX2 static void rows_twohot_avx2(const float* logits, const float* bins, float* probs,
                                        float* mean, float* e, int64_t r0, int64_t r1,
                                        int64_t width, int64_t n) {
  const int64_t m = n / 2, w8 = width / 8 * 8;
  const __m256i reverse = _mm256_set_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t r = r0; r < r1; ++r) {
    const float* l = logits + r * width;
    float mx;
    if (!row_max_avx2(l, width, mx)) { bad_row(probs, mean, r, width); continue; }
    const float s = exp_row_avx2(l, mx, e, width);
    // sum_j (e[m+1+j] - e[m-1-j]) bins[m+1+j], 8 j at a time (e[m-8-j .. m-1-j] reversed)
    __m256 va = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= m; j += 8) {
      const __m256 hi = _mm256_loadu_ps(e + m + 1 + j);
      const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(e + m - 8 - j), reverse);
      va = _mm256_fmadd_ps(_mm256_sub_ps(hi, lo), _mm256_loadu_ps(bins + m + 1 + j), va);
    }
    float acc = hsum8(va);
    for (; j < m; ++j) acc += (e[m + 1 + j] - e[m - 1 - j]) * bins[m + 1 + j];
    mean[r] = acc / s;
    if (probs) {
      float* p = probs + r * width;
      const __m256 inv = _mm256_set1_ps(1.0f / s);
      for (int64_t k = 0; k < w8; k += 8)
        _mm256_storeu_ps(p + k, _mm256_mul_ps(_mm256_loadu_ps(e + k), inv));
      for (int64_t k = w8; k < width; ++k) p[k] = e[k] / s;
    }
  }
}

LUCID_AVX2 static void rows_sample_avx2(const float* logits, const float* u, int64_t* idx,
                                        float* e, int64_t r0, int64_t r1, int64_t K, float a) {
  const int64_t k8 = K / 8 * 8;
  for (int64_t r = r0; r < r1; ++r) {
    const float* l = logits + r * K;
    float mx;
    if (!row_max_avx2(l, K, mx)) { idx[r] = K - 1; continue; }  // as rows_sample
    const float s = exp_row_avx2(l, mx, e, K);
    // p = e / s * (1 - a) + a / K, rounded as inverse_cdf's scalar steps (no fused multiply-add)
    const __m256 vsum = _mm256_set1_ps(s), keep = _mm256_set1_ps(1.0f - a),
                 mix = _mm256_set1_ps(a / (float)K);
    for (int64_t k = 0; k < k8; k += 8)
      _mm256_storeu_ps(e + k, _mm256_add_ps(_mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(e + k), vsum), keep), mix));
    for (int64_t k = k8; k < K; ++k) e[k] = e[k] / s * (1.0f - a) + a / (float)K;
    idx[r] = cdf_search(e, u[r], K);
  }
}
#endif

// probs (or an empty tensor for none) and the symlog-space mean of logits (..., width).
std::vector<torch::Tensor> twohot_softmax_mean(torch::Tensor logits, torch::Tensor bins,
                                               int64_t n, bool with_probs) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat && bins.scalar_type() == torch::kFloat,
              "twohot_softmax_mean: float32 logits and bins");
  const int64_t width = logits.size(-1);
  TORCH_CHECK(n % 2 == 1 && n <= width && bins.numel() == n,
              "twohot_softmax_mean: an odd number of bins n <= the logits' width");
  logits = logits.contiguous();
  bins = bins.contiguous();
  const int64_t rows = logits.numel() / width;
  auto mean = torch::empty({rows}, logits.options());
  auto probs = with_probs ? torch::empty_like(logits) : torch::empty({0}, logits.options());
  const float* l = logits.data_ptr<float>();
  const float* b = bins.data_ptr<float>();
  float* pr = with_probs ? probs.data_ptr<float>() : nullptr;
  float* mu = mean.data_ptr<float>();
#if defined(__x86_64__) && defined(__GNUC__)
  const bool avx2 = use_avx2();
#endif
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(width);
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2) return rows_twohot_avx2(l, b, pr, mu, e.data(), r0, r1, width, n);
#endif
    rows_twohot(l, b, pr, mu, e.data(), r0, r1, width, n);
  });
  auto shape = logits.sizes().vec();
  shape.pop_back();
  return {probs, mean.view(shape)};
}

// Categorical samples of float32 logits (rows, K) from uniforms u (rows): int64 (rows).
torch::Tensor unimix_sample(torch::Tensor logits, torch::Tensor u, double unimix) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat && u.scalar_type() == torch::kFloat &&
              logits.dim() == 2 && u.numel() == logits.size(0),
              "unimix_sample: float32 logits (rows, K) and uniforms (rows)");
  logits = logits.contiguous();
  u = u.contiguous();
  const int64_t rows = logits.size(0), K = logits.size(1);
  auto idx = torch::empty({rows}, logits.options().dtype(torch::kLong));
  const float* l = logits.data_ptr<float>();
  const float* uu = u.data_ptr<float>();
  int64_t* out = idx.data_ptr<int64_t>();
  const float a = (float)unimix;
#if defined(__x86_64__) && defined(__GNUC__)
  const bool avx2 = use_avx2();
#endif
  at::parallel_for(0, rows, 256, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(K);
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2) return rows_sample_avx2(l, uu, out, e.data(), r0, r1, K, a);
#endif
    rows_sample(l, uu, out, e.data(), r0, r1, K, a);
  });
  return idx;
}
"""

# -fopenmp: at::parallel_for runs on OpenMP threads in Linux builds of torch.
_FLAGS = ["-O3", "-fopenmp"] if sys.platform.startswith("linux") else ["-O3"]
_module = None


def build():
    """The compiled module (built or loaded from the cache at the first call). Raises a
    RuntimeError that names the fix when no C++ compiler can build it."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import load_inline
        log.info("loading lucid's C++ kernels (built once per machine, ~40 s)")
        try:
            _module = load_inline("lucid_kernels", cpp_sources=_SOURCE,
                                  functions=["table_grad", "twohot_softmax_mean",
                                             "unimix_sample", "set_simd"],
                                  extra_cflags=_FLAGS)
        except Exception as e:  # a missing compiler or headers
            raise RuntimeError(
                f"train.cpp_kernels=true could not build lucid's C++ kernels ({e}); install "
                f"a C++ compiler and the Python headers (Debian: apt install g++ "
                f"python3-dev), or set train.cpp_kernels=false") from e
    return _module


_enabled = False


def enabled(logits: torch.Tensor | None = None) -> bool:
    """Whether lucid's C++ kernels are in use in this process (`enable`) and, given `logits`,
    take them: CPU tensors of float32, or half ones (read as float32); not float64."""
    return _enabled and (logits is None or (
        logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16,
                                                         torch.float16)))


def module():
    """The built module, for the operators that call it (`nets`)."""
    return _module


def enable(on: bool = True) -> None:
    """Use the kernels from now on in this process (building them first), or stop."""
    global _enabled
    if on:
        build()
    _enabled = on


def use_simd(on: bool = True) -> bool:
    """Whether the softmax/two-hot and sampling kernels take their AVX2 loops where the CPU
    has AVX2 and FMA (the default) or the portable ones that other CPUs run (for tests);
    returns the previous setting. table_grad's loop is one source compiled per instruction
    set, chosen by the CPU alone."""
    return build().set_simd(on)


def table_grad(idx: torch.Tensor, grad: torch.Tensor, rows: int) -> torch.Tensor | None:
    """The C++ table gradient where it applies (enabled, CPU, float32), else None."""
    if not _enabled or grad.device.type != "cpu" or grad.dtype != torch.float32:
        return None
    return _module.table_grad(idx, grad, rows)
