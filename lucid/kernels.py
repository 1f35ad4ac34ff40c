"""C++ CPU kernels, built on demand (`train.cpp_kernels`).

One kernel so far: the table gradient of `nets.gather_sum` (the one-hot layers of
`train.onehot_gather`), table_grad[idx[r, g]] += grad[r] over rows r and groups g. ATen has
no single call for it: `index_add_` per group passes over the (rows, units) gradient once per
group and sorts each group's indices, 5.3 ms at 15,360 x 16 groups x 64 units on 2 threads,
where one pass adding each gradient row into a table that stays in cache takes 1.5 ms
(docs/performance.md). Each thread adds its share of the rows into its own table, and the
tables are summed in thread order: the same result for the same number of threads.

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

// One copy of the loop per instruction set, picked at run time (GCC on x86-64): AVX2 halves
// the time of the SSE2 baseline, and the build stays right for every x86-64 CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void add_rows(const float* grad, const int64_t* idx, float* table, int64_t r0,
                     int64_t r1, int64_t groups, int64_t units) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = grad + r * units;
    for (int64_t g = 0; g < groups; ++g) {
      float* __restrict__ dst = table + idx[r * groups + g] * units;
      for (int64_t u = 0; u < units; ++u) dst[u] += src[u];
    }
  }
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
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      add_rows(g, ix, t + p * table_rows * units, rows * p / parts, rows * (p + 1) / parts,
               groups, units);
  });
  if (parts == 1) return tables[0];
  auto out = tables[0].clone();
  for (int64_t p = 1; p < parts; ++p) out.add_(tables[p]);  // in thread order
  return out;
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
                                  functions=["table_grad"],
                                  extra_cflags=_FLAGS)
        except Exception as e:  # a missing compiler or headers
            raise RuntimeError(
                f"train.cpp_kernels=true could not build lucid's C++ kernels ({e}); install "
                f"a C++ compiler and the Python headers (Debian: apt install g++ "
                f"python3-dev), or set train.cpp_kernels=false") from e
    return _module


_enabled = False


def enable(on: bool = True) -> None:
    """Use the kernels from now on in this process (building them first), or stop."""
    global _enabled
    if on:
        build()
    _enabled = on


def table_grad(idx: torch.Tensor, grad: torch.Tensor, rows: int) -> torch.Tensor | None:
    """The C++ table gradient where it applies (enabled, CPU, float32), else None."""
    if not _enabled or grad.device.type != "cpu" or grad.dtype != torch.float32:
        return None
    return _module.table_grad(idx, grad, rows)
