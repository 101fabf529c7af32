"""bench/kernel_shares.py sorts a torch.profiler window's kernels into kinds, a step's seconds each."""

from __future__ import annotations

import json

import pytest

from bench.kernel_shares import kind_of, main


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", "matmuls (cuBLAS)"),
        ("triton_tem_fused_flex_attention_backward_mul_1", "attention"),
        ("triton_red_fused_flex_attention_backward_mul_0", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
        ("triton_red_fused_abs_amax_clamp_div_0", "FP8 row scaling"),
        ("_rms_norm_backward_kernel", "Liger (norm, SwiGLU, RoPE, loss)"),
        ("liger_cross_entropy_kernel", "Liger (norm, SwiGLU, RoPE, loss)"),
        ("void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>(float*", "NF4 dequantization"),
        (
            "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>",
            "elementwise and copies",
        ),
        ("Memcpy DtoD (Device -> Device)", "elementwise and copies"),
        ("triton_poi_fused_mul_1", "elementwise and copies"),
        ("some_new_kernel", "other"),
    ],
)
def test_a_kernel_is_sorted_by_its_name(name, kind):
    assert kind_of(name) == kind


def test_a_window_is_split_by_kind_per_step_with_what_the_list_left_out(tmp_path):
    profile = {
        "first_step": 4, "last_step": 5, "kernels": 10, "kernel_busy_s": 8.0, "kernel_span_s": 10.0,
        "top_kernels": [
            {"name": "nvjet_sm90_a", "s": 4.0, "calls": 4},
            {"name": "nvjet_sm90_b", "s": 2.0, "calls": 2},
            {"name": "triton_tem_fused_flex_attention_0", "s": 1.0, "calls": 2},
        ],
    }  # fmt: skip
    (tmp_path / "torch_profile.json").write_text(json.dumps(profile))
    runs = main([str(tmp_path / "kinds.png"), f"h100={tmp_path}"])
    run = runs["h100"]
    assert run["s_per_step"] == {"matmuls (cuBLAS)": 3.0, "attention": 0.5, "not listed": 0.5}
    assert run["kernel_s_per_step"] == 4.0 and run["idle_share"] == pytest.approx(0.2)
    assert run["longest"][0] == ("nvjet_sm90_a", 2.0, 2)
    assert (tmp_path / "kinds.png").stat().st_size > 0
