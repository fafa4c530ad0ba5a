"""The kernel breakdown's arithmetic (`python -m chorus.bench.kernels` itself needs a GPU)."""

from chorus.bench.kernels import family, summarize


def test_kernels_fall_into_families():
    assert family("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64") == "matmul"
    assert family("_decode_attention_kernel") == "attention"
    assert family("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long>") == "sort_scan"
    assert family("triton_per_fused__softmax_cumsum_0") == "sort_scan"  # a sort or scan fused in is still one
    assert family("triton_poi_fused_add_mul_rsqrt_3") == "fused"
    assert family("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") == "other"


def test_busy_time_is_the_union_of_kernel_intervals():
    kernels = [  # (name, start µs, duration µs): two overlap (streams), then a gap of 10 µs
        ("gemm_a", 0.0, 10.0),
        ("triton_poi_fused_b", 5.0, 10.0),
        ("gemm_c", 25.0, 5.0),
    ]
    summary = summarize(kernels, steps=2, wall_ms=0.1)
    assert summary["gpu_busy_ms_per_step"] == 0.01  # (15 + 5) µs over 2 steps
    assert summary["kernel_ms_per_step"] == 0.0125  # 25 µs of kernels over 2 steps
    assert summary["kernels_per_step"] == 1.5
    assert summary["wall_ms_per_step"] == 0.05
    assert summary["family_ms_per_step"]["matmul"] == 0.0075
    assert summary["family_ms_per_step"]["fused"] == 0.005
    assert [kernel["name"] for kernel in summary["top_kernels"]] == ["gemm_a", "triton_poi_fused_b", "gemm_c"]
