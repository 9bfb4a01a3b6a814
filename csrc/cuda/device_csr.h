// A CSR as the GPU kernels read it, with its schedule: the segments and heavy rows of
// csrc/dignn/schedule.h, built on the device from rowptr alone (no host sync).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "cuda/device_scope.h"
#include "cuda/launch.h"
#include "ops/checks.h"

namespace dignn {
namespace DIGNN_SIMT_NS {

struct DeviceCsr {
  at::Tensor rowptr;  // int64 [n + 1]
  at::Tensor col;     // int32 [m]
  at::Tensor incl, segment_row, heavy_row;  // ScheduleView
  int64_t n = 0, m = 0;

  ScheduleView schedule() const {
    return {incl.data_ptr<int64_t>(), segment_row.data_ptr<int32_t>(),
            heavy_row.data_ptr<int32_t>(), n};
  }
};

// The graph's part of a DeviceCsr (no schedule yet).
inline DeviceCsr device_csr_graph(const at::Tensor& rowptr, const at::Tensor& col) {
  DeviceCsr s;
  s.rowptr = rowptr.contiguous();
  s.n = num_rows(rowptr);
  s.col = index32(col, s.n);
  s.m = col.numel();
  return s;
}

inline DeviceCsr make_device_csr(const at::Tensor& rowptr, const at::Tensor& col,
                                 simt::Stream stream) {
  DeviceCsr s = device_csr_graph(rowptr, col);
  const auto i64 = rowptr.options().dtype(at::kLong);
  at::Tensor counts = at::empty({3, s.n}, i64);
  check_status(launch_schedule_counts(s.rowptr.data_ptr<int64_t>(), s.n,
                                      counts.data_ptr<int64_t>(), stream),
               "schedule_counts");
  // Three 1-D scans: ATen runs those as one device-wide (cub) scan each, where a scan along
  // dim 0 of an n x 3 tensor would be a serial loop over n per column.
  s.incl = at::empty({3, s.n}, i64);
  for (int64_t c = 0; c < 3; ++c) {
    at::Tensor dst = s.incl.select(0, c);
    at::cumsum_out(dst, counts.select(0, c), 0);
  }
  s.segment_row = at::empty({max_segments(s.n, s.m)}, i64.dtype(at::kInt));
  s.heavy_row = at::empty({max_heavy_rows(s.m)}, i64.dtype(at::kInt));
  check_status(launch_schedule_fill(s.incl.data_ptr<int64_t>(), s.n,
                                    s.segment_row.data_ptr<int32_t>(),
                                    s.heavy_row.data_ptr<int32_t>(), stream),
               "schedule_fill");
  return s;
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
