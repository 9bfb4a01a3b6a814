"""bench/layer/kernel_times.py on the CPU: the role of every kernel name of a real GPU profile, and
profile_step's per-role sums, profiled with CPU activities on a tiny layer step."""
import pytest
import torch
from torch.profiler import ProfilerActivity

import dignn_kernels as dk
from kernel_times import ROLES, kernel_role, profile_step

# Names as torch.profiler printed them in the H100 profile of 2026-11-23
# (bench/results/gpu_h100_2026-11-23/profile_step_and_cora_epoch.txt; its table cut the long
# ones off with "..."), each with its role.
H100_PROFILE_NAMES = [
    ("void dignn::cuda::row_pass_kernel<float, 4, 8, false>(dig...", "cached row pass"),
    ("void dignn::cuda::row_pass_kernel<float, 4, 8, true>(dign...", "neural row pass"),
    ("void dignn::cuda::grad_pass_kernel<float, 4, 8>(dignn::cu...", "gradient pass"),
    ("void dignn::cuda::row_combine_kernel<float, false>(dignn:...", "combine (heavy rows)"),
    ("dignn::cuda::finalize_step_kernel(double const*, long, do...", "step bookkeeping"),
    ("_csr_fma_kernel", "cached row pass"),
    ("_neural_step_kernel", "neural row pass"),
    ("_weight_grad_kernel", "gradient pass"),
    ("_csr_fma_combine_kernel", "combine (heavy rows)"),
    ("_finish_step_kernel", "step bookkeeping"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_sta...", "dense (aten)"),
    ("aten::mm", "dense (aten)"),
    ("aten::addmm", "dense (aten)"),
    ("aten::native_batch_norm", "dense (aten)"),
    ("dignn::implicit_diffusion_backward", "other"),
    ("dignn_triton::implicit_diffusion", "other"),
    ("autograd::engine::evaluate_function: MmBackward0", "other"),
    ("GeneratedBackwardFor_dignn_implicit_diffusion_defaultBack...", "other"),
    ("Optimizer.step#Adam.step", "other"),
]

# Full demangled names of the current kernels (csrc/cuda/*.cuh, the Triton modules), and of
# torch's kernels and device events.
CURRENT_NAMES = [
    ("void dignn::cuda::row_pass_kernel<float, float, 4, 8, false, false>(dignn::cuda::"
     "RowPassArgs<float, float>)", "cached row pass"),
    ("void dignn::cuda::row_pass_kernel<float, float, 4, 8, false, true>(dignn::cuda::"
     "RowPassArgs<float, float>)", "cached row pass"),  # cg's row product
    ("void dignn::cuda::row_pass_kernel<double, double, 1, 16, true, false>(dignn::cuda::"
     "RowPassArgs<double, double>)", "neural row pass"),
    ("void dignn::cuda::row_pass_kernel<float, c10::BFloat16, 4, 8, false, false>(dignn::"
     "cuda::RowPassArgs<float, c10::BFloat16>)", "cached row pass"),
    ("void dignn::cuda::neural_weight_grad_kernel<float, float, 4, 8, true>(dignn::cuda::"
     "NeuralWeightGradArgs<float, float>)", "gradient pass"),
    ("void dignn::cuda::neural_weight_grad_combine_kernel<float, float>(dignn::cuda::"
     "NeuralWeightGradArgs<float, float>)", "combine (heavy rows)"),
    ("_neural_edge_weights_kernel", "neural row pass"),
    ("_neural_weight_grad_kernel", "gradient pass"),
    ("void dignn::cuda::row_product_dots_kernel<float>(double const*, long, dignn::cuda::"
     "ScheduleView, float const*, float const*, long, double const*, float*)",
     "step bookkeeping"),
    # the template arguments of 2026-11-23 (one boolean)
    ("void dignn::cuda::row_pass_kernel<float, 4, 8, false>(dignn::cuda::RowPassArgs<float>)",
     "cached row pass"),
    ("void dignn::cuda::row_pass_kernel<double, 2, 16, true>(dignn::cuda::RowPassArgs<double>)",
     "neural row pass"),
    ("void dignn::cuda::grad_pass_kernel<float, 4, 8, true>(dignn::cuda::GradPassArgs<float>)",
     "gradient pass"),
    ("void dignn::cuda::row_combine_kernel<float, true>(dignn::cuda::RowPassArgs<float>)",
     "combine (heavy rows)"),
    ("void dignn::cuda::grad_combine_kernel<float>(dignn::cuda::GradPassArgs<float>)",
     "combine (heavy rows)"),
    ("_neural_weights_combine_kernel", "combine (heavy rows)"),
    ("_weight_grad_combine_kernel", "combine (heavy rows)"),
    ("void dignn::cuda::sum_squares_kernel<float>(float const*, long, double*)",
     "step bookkeeping"),
    ("_cg_step_kernel", "step bookkeeping"),
    ("_column_dots_kernel", "step bookkeeping"),
    ("dignn::cuda::schedule_counts_kernel(long const*, long, long*)", "other"),
    ("dignn::cuda::schedule_fill_kernel(long const*, long, int*, int*)", "other"),
    ("void dignn::cuda::row_coefficients_kernel<float>(float const*, float const*, float, "
     "long, float*, float*)", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "dense (aten)"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned "
     "int, 2, 2, -2, true>(...)", "dense (aten)"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "dense (aten)"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nt_align1>(...)", "dense (aten)"),
    ("Memcpy DtoD (Device -> Device)", "other"),
    ("Memset (Device)", "other"),
]


@pytest.mark.parametrize("name,role", H100_PROFILE_NAMES + CURRENT_NAMES)
def test_kernel_role(name, role):
    assert kernel_role(name) == role


def test_every_triton_kernel_has_a_role():
    """Each Triton kernel of the project (every ``*_kernel`` of its two Triton modules, as a
    profile names it) is counted in one of the project's roles, not as "other"."""
    pytest.importorskip("triton")
    from dignn_kernels.backends import _triton_jit
    from dignn_kernels.solvers import _triton_cg
    names = [name for module in (_triton_jit, _triton_cg) for name in dir(module)
             if name.endswith("_kernel")]
    assert len(names) >= 8
    assert [name for name in names if kernel_role(name) == "other"] == []


def test_every_cuda_kernel_has_a_role():
    """Each CUDA kernel of csrc/cuda/ (every ``DIGNN_KERNEL(...) name(``) is one that
    kernel_role knows by name: counted in its role, or as "other" on purpose (the setup of a
    graph or a solve), never by default."""
    import re
    from pathlib import Path
    import kernel_times
    sources = Path(__file__).resolve().parents[2] / "csrc" / "cuda"
    names = {name for path in sources.glob("*") for name in
             re.findall(r"DIGNN_KERNEL\(\w+\)\s+(\w+)\(", path.read_text())}
    assert {"row_pass_kernel", "row_product_dots_kernel", "neural_weight_grad_kernel"} <= names
    known = set(kernel_times._PROJECT_KERNELS) | {kernel_times._ROW_PASS}
    assert sorted(names - known) == []


def ring_layer_step():
    """One training step of a small layer on an 8-node ring, CPU backend."""
    n, channels = 8, 4
    nodes = torch.arange(n)
    edge_index = torch.stack([torch.cat([nodes, (nodes + 1) % n]),
                              torch.cat([(nodes + 1) % n, nodes])])
    torch.manual_seed(0)
    layer = dk.FusedImplicitDiffusion(channels, mu=2.2, max_iter=3, tol=0.0, backend="cpu",
                                      solver="fixed_point")  # the fused C++ loop
    x = torch.randn(n, channels, requires_grad=True)

    def step():
        layer(x, edge_index).square().sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)
    return step


def test_profile_step_on_the_cpu():
    rounds = 3
    roles = profile_step(ring_layer_step(), rounds, activity=ProfilerActivity.CPU)
    assert tuple(roles) == ROLES
    for role, entry in roles.items():
        assert set(entry) == {"us", "launches", "kernels"}
        assert entry["us"] == pytest.approx(sum(k["us"] for k in entry["kernels"].values()))
        assert entry["launches"] == pytest.approx(
            sum(k["calls"] for k in entry["kernels"].values()))
        assert all(kernel_role(name) == role for name in entry["kernels"])
    # per step, without the warm-up: one forward op and one backward op of the layer
    assert roles["other"]["kernels"]["dignn::implicit_diffusion"]["calls"] == 1
    assert roles["other"]["kernels"]["dignn::implicit_diffusion_backward"]["calls"] == 1
    assert roles["dense (aten)"]["kernels"]["aten::mm"]["calls"] >= 1
    assert roles["dense (aten)"]["us"] > 0


@pytest.mark.parametrize("kwargs,match", [(dict(rounds=0), "rounds"),
                                          (dict(rounds=1, activity=ProfilerActivity.XPU),
                                           "activity")])
def test_profile_step_argument_errors(kwargs, match):
    ran = []
    with pytest.raises(ValueError, match=match):
        profile_step(lambda: ran.append(1), **kwargs)
    assert not ran  # refused before running the step
