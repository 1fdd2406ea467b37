"""W8A8 prefill: FP8 block weights times activations quantized to FP8 per 128 columns, on FP8 tensor cores.

The decode kernels (glmkernels/triton_linear.py, triton_moe.py) keep bf16 activations (W8A16). For prefill chunks
— many rows, compute-bound — this backend quantizes the activations as DeepSeek-V3 / GLM-5 FP8 checkpoints are
served by vLLM and SGLang ("dynamic" activation scheme): each row's 128-column group gets its own scale,
``s = max|x| / 448`` (at least 1e-12), ``q = e4m3(x / s)`` (round to nearest even, saturated); then

    y[m, n] = Σ_kb dot(q[m, kb], W8[n, kb]) · s[m, kb] · S[n // 128, kb]          (kb: 128-column blocks)

in fp32, every 128-wide dot on the FP8 tensor cores (exact products, fp32 sums), rounded once to x's dtype.
That is ``reference.linear_w8a8``. The grouped MoE (``w8a8_moe``) does the same for the experts' gate/up and
down: the rows are quantized once, the SiLU-gated activation is quantized per 128 columns inside the gate/up
launch (its program covers exactly one 128-column group), and the roundings between are the reference's
(``reference.moe_experts_w8a8``). Activation quantization costs accuracy: about 2.6 % relative error per dense
linear's output, 4.4 % per MoE's, against W8A16 on random data (session 13; e4m3 keeps 3 mantissa bits), which is why
it is opt-in (``prefill_activations: fp8``), registered as the backend ``triton_w8a8`` of the ``linear`` and
``moe_experts`` ops: more than ``MIN_ROWS`` rows take these kernels, fewer (decode, verify) the ``triton`` backend's
W8A16 ones.

The fp8 rounding is done in fp32 before the cast (``_e4m3``), so the cast itself is exact: Triton's CPU
interpreter drops the mantissa carry of a rounding cast (7.99 → 4.0), and this way the interpreter and the GPU
give the reference's codes bit for bit. Divisions are IEEE (``div_rn``), as torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels import reference, triton_linear, triton_moe
from glmkernels.registry import ops
from glmkernels.triton_moe import _combine, _group_block, _grouped_down_kernel, group_pairs, group_rows
from glmkernels.triton_utils import on_cuda

MIN_ROWS = triton_linear.PREFILL_ROWS + 1     # rows from which the W8A8 kernels run (fewer: W8A16)
MIN_LINEAR_WORK = 1 << 36   # M·N·K from which a dense linear runs W8A8: below it cuBLAS's bf16 GEMM after the
                            # weight's dequantization was as fast or faster on H200 (q_a, kv_a, the indexer's wq_b
                            # at 2048 rows: bench/results/session13/)


@triton.jit
def _e4m3(y):
    """fp32 → the nearest e4m3 value (ties to even, saturated at ±448) as float8e4nv. The rounding is an fp32 add
    to |y| of a constant whose ulp is the e4m3 ulp of y's binade (2^(e-3); e ≥ -6 covers the subnormals), then
    y's sign bit (so that -0.0 and negatives rounding to zero stay -0.0, as torch's cast)."""
    bits = y.to(tl.int32, bitcast=True)
    a = tl.minimum(tl.abs(y), 448.0)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    magic = (((e + 147) << 23) | (1 << 22)).to(tl.float32, bitcast=True)      # 1.5 · 2^(e + 20)
    r = ((a + magic) - magic).to(tl.int32, bitcast=True) | ((bits >> 31) << 31)
    return r.to(tl.float32, bitcast=True).to(tl.float8e4nv)


@triton.jit
def _quant_rows(x):
    """x: [BM, 128] fp32 → (its e4m3 codes, one scale per row: max|x| · (1/448), at least 1e-12)."""
    s = tl.maximum(tl.max(tl.abs(x), axis=1) * (1.0 / 448.0), 1e-12)
    return _e4m3(tl.math.div_rn(x, s[:, None])), s


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, M, M_out, K, stride_xm, stride_sm, stride_sk, BLOCK_M: tl.constexpr):
    """Rows [0, M) of x quantized, rows [M, M_out) written as zeros (codes 0, scale 1e-12)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    kb = tl.program_id(1)
    rk = kb * 128 + tl.arange(0, 128)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
                mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0).to(tl.float32)
    q, s = _quant_rows(x)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=(rm[:, None] < M_out) & (rk[None, :] < K))
    tl.store(s_ptr + rm * stride_sm + kb * stride_sk, s, mask=rm < M_out)


def act_quant(x: torch.Tensor, rows: int | None = None, col_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] → (q [rows, K] float8_e4m3fn, s [rows, ⌈K/128⌉] fp32), as ``reference.act_quant``; ``rows`` ≥ M pads
    with zero rows; ``col_major``: s is a transposed view (its row index varies fastest, as cuBLAS wants)."""
    M, K = x.shape
    rows = M if rows is None else rows
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_kb = triton.cdiv(K, 128)
    q = torch.empty(rows, K, dtype=torch.float8_e4m3fn, device=x.device)
    s = (torch.empty(num_kb, rows, dtype=torch.float32, device=x.device).t() if col_major
         else torch.empty(rows, num_kb, dtype=torch.float32, device=x.device))
    if rows:
        _act_quant_kernel[(triton.cdiv(rows, 32), num_kb)](x, q, s, M, rows, K, x.stride(0), s.stride(0), s.stride(1),
                                                           BLOCK_M=32, num_warps=4)
    return q, s


@triton.jit
def _gemm_kernel(q_ptr, qs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, num_kb, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # the fallback of ``w8a8_linear`` (and the CPU interpreter's): about half of cuBLAS's speed on H200
    """out[m, n] = Σ_kb dot(q, W8) · s[m, kb] · S[n // 128, kb]; programs ordered in groups of GROUP_M row tiles
    so that one weight column tile is reused from L2 while its rows pass."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % rows_in_group
    pid_n = (pid % (GROUP_M * num_n)) // rows_in_group
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, 128)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(num_kb):
        k = kb * 128 + rk
        a = tl.load(q_ptr + rm[:, None].to(tl.int64) * K + k[None, :], mask=m_ok[:, None] & (k[None, :] < K),
                    other=0.0)
        b = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + k[None, :], mask=n_ok[:, None] & (k[None, :] < K),
                    other=0.0)
        sa = tl.load(qs_ptr + rm * num_kb + kb, mask=m_ok, other=0.0)
        sb = tl.load(ws_ptr + (rn // 128) * num_kb + kb, mask=n_ok, other=0.0)
        acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
    tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def w8a8_linear(x: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor, gemm: str = "auto", block_n: int = 128,
                num_warps: int = 8, num_stages: int = 3) -> torch.Tensor:
    """x: [..., K] → [..., N] in x's dtype: activations quantized per 128 columns, then the FP8 GEMM (as
    ``reference.linear_w8a8``): cuBLAS's block-scaled one (``torch._scaled_mm``, 1×128 activation and 128×128 weight
    scales; 1.0–1.2 PFLOP/s on H200's big prefill shapes, twice the Triton kernel) where this torch and GPU have it,
    else the Triton kernel below. ``gemm``: auto | cublas | triton; the Triton launch shape for benchmarks."""
    K, N = x.shape[-1], w8.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    assert w8.is_contiguous() and scale_inv.shape == (triton.cdiv(N, 128), triton.cdiv(K, 128))
    if gemm == "cublas" and K % 512:
        raise RuntimeError(f"cuBLAS's block-scaled GEMM needs K a multiple of 512 (4 scale blocks), got {K}")
    # K % 512: with a K-block count not a multiple of 4 cuBLAS returns wrong products without an error (torch 2.11,
    # CUDA 13, H200: bench/results/session13/call10/cublas_shapes.txt); GLM-5's FP8 linears all have K % 512 == 0
    if gemm != "triton" and M and x.is_cuda and K % 512 == 0 and _cublas_block_scaled(x.device, gemm == "cublas"):
        q, s = act_quant(x2, rows=-(-M // 4) * 4, col_major=True)           # cuBLAS: rows a multiple of 4
        out = torch._scaled_mm(q, w8.t(), s, scale_inv.t(), out_dtype=x.dtype)[:M]
        return out.view(*x.shape[:-1], N)
    q, s = act_quant(x2)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M:
        grid = (triton.cdiv(M, 128) * triton.cdiv(N, block_n),)
        _gemm_kernel[grid](q, s, w8, scale_inv.contiguous(), out, M, N, K, s.shape[1], BLOCK_M=128, BLOCK_N=block_n,
                           GROUP_M=8, num_warps=num_warps, num_stages=num_stages)
    return out.view(*x.shape[:-1], N)


_CUBLAS: dict[torch.device, bool] = {}


def _cublas_block_scaled(device: torch.device, required: bool = False) -> bool:
    """Whether ``torch._scaled_mm`` takes 1×128 / 128×128 block scales on this device (torch ≥ 2.9 built with CUDA
    ≥ 12.9, Hopper): tried once per device on a tiny product checked against the reference."""
    if device not in _CUBLAS:
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(4, 512, device=device, generator=g).to(torch.bfloat16)
        w8, ws = reference.fp8_quantize(torch.randn(256, 512, device=device, generator=g))
        try:
            q, s = act_quant(x, col_major=True)
            y = torch._scaled_mm(q, w8.t(), s, ws.t(), out_dtype=torch.bfloat16)
            ok = bool(torch.allclose(y.float(), reference.linear_w8a8(x.float(), w8, ws), rtol=2e-2, atol=1e-2))
        except (RuntimeError, TypeError, ValueError):
            ok = False
        _CUBLAS[device] = ok
    if required and not _CUBLAS[device]:
        raise RuntimeError(f"torch {torch.__version__} has no block-scaled FP8 GEMM on {device}")
    return _CUBLAS[device]


@triton.jit
def _moe_gate_up_kernel(q_ptr, qs_ptr, g_ptr, u_ptr, gs_ptr, us_ptr, block_e_ptr, slot_pair_ptr, aq_ptr, as_ptr,
                        H, I, num_sb_h, num_sb_i, TOPK: tl.constexpr, BLOCK_M: tl.constexpr, DT: tl.constexpr):
    """Block b of one expert's padded run, 128 gate/up outputs (one scale group of I): a = silu(g) · u from the
    quantized rows (roundings to DT as the reference's linears), then a's e4m3 codes and per-row scale."""
    ib = tl.program_id(1)
    e, slots, pair, live = _group_block(block_e_ptr, slot_pair_ptr, tl.program_id(0), BLOCK_M)
    if e < 0:                      # past the last block (group_pairs' bound)
        return
    row = tl.where(live, pair // TOPK, 0).to(tl.int64)
    ri = ib * 128 + tl.arange(0, 128)
    rh = tl.arange(0, 128)
    acc_g = tl.zeros((BLOCK_M, 128), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, 128), dtype=tl.float32)
    w_base = e.to(tl.int64) * I * H
    s_base = e * num_sb_i * num_sb_h + ib * num_sb_h
    for hb in range(num_sb_h):
        h = hb * 128 + rh
        x = tl.load(q_ptr + row[:, None] * H + h[None, :], mask=live[:, None] & (h[None, :] < H), other=0.0)
        sx = tl.load(qs_ptr + row * num_sb_h + hb, mask=live, other=0.0)
        wmask = (ri[:, None] < I) & (h[None, :] < H)
        wg = tl.load(g_ptr + w_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0)
        wu = tl.load(u_ptr + w_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0)
        acc_g += tl.dot(x, tl.trans(wg)) * (sx[:, None] * tl.load(gs_ptr + s_base + hb))
        acc_u += tl.dot(x, tl.trans(wu)) * (sx[:, None] * tl.load(us_ptr + s_base + hb))
    g = acc_g.to(DT).to(tl.float32)
    u = acc_u.to(DT).to(tl.float32)
    a = ((g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32) * u).to(DT).to(tl.float32)
    aq, sa = _quant_rows(tl.where(ri[None, :] < I, a, 0.0))
    tl.store(aq_ptr + slots[:, None].to(tl.int64) * I + ri[None, :], aq, mask=ri[None, :] < I)
    tl.store(as_ptr + slots * num_sb_i + ib, sa)


def w8a8_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
             down: torch.Tensor, gate_s: torch.Tensor, up_s: torch.Tensor, down_s: torch.Tensor,
             expert_offset: int = 0, block_m: int | None = None, down_n: int = 128,
             num_warps: int = 8, num_stages: int = 4) -> torch.Tensor:
    """Routed experts (FP8 with block scales) over x: [N, H] with activations quantized per 128 columns, as
    ``reference.moe_experts_w8a8``; the grouped launches' row blocks and combine (``triton_moe.grouped_moe``).
    No host sync. ``block_m``, ``down_n`` (down outputs a program) and warps / stages for benchmarks (the defaults
    within 4 % of the best of 48 launch shapes at 2048 and 8192 rows on H200: bench/results/session13/)."""
    N, H = x.shape
    E_local, I, _ = gate.shape
    k = topk_idx.shape[1]
    block_m = block_m or group_rows(N, k, E_local)
    block_e, slot_pair, order, valid = group_pairs(topk_idx, expert_offset, E_local, block_m)
    num_blocks = block_e.numel()
    q, qs = act_quant(x)
    num_sb_h, num_sb_i = triton.cdiv(H, 128), triton.cdiv(I, 128)
    aq = torch.empty(num_blocks * block_m, I, dtype=torch.float8_e4m3fn, device=x.device)
    a_s = torch.empty(num_blocks * block_m, num_sb_i, dtype=torch.float32, device=x.device)
    y = torch.empty(N * k, H, dtype=x.dtype, device=x.device)
    if num_blocks:
        launch = {"num_warps": num_warps, "num_stages": num_stages}
        _moe_gate_up_kernel[(num_blocks, num_sb_i)](
            q, qs, gate, up, gate_s, up_s, block_e, slot_pair, aq, a_s, H, I, num_sb_h, num_sb_i, TOPK=k,
            BLOCK_M=block_m, DT=triton_linear.TL_DTYPES[x.dtype], **launch)
        _grouped_down_kernel[(num_blocks, triton.cdiv(H, down_n))](
            aq, down, down_s, topk_w.float().contiguous(), block_e, slot_pair, y, H, I, num_sb_h, num_sb_i,
            HAS_SCALE=True, BLOCK_M=block_m, BLOCK_HO=down_n, PREC="tf32", as_ptr=a_s, ACT_SCALED=True, **launch)
    return _combine(y, order, valid, torch.empty_like(x), N, H, k)


def _quantized(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Rows and weights these kernels take: 2-D rows in a Triton float dtype, contiguous FP8 weights."""
    return (x.dim() >= 1 and x.dtype in triton_linear.TL_DTYPES
            and all(w.dtype == torch.float8_e4m3fn and w.is_contiguous() for w in weights))


@ops.register("linear", backend="triton_w8a8", available=on_cuda)
def linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor | None = None) -> torch.Tensor:
    """As the ``triton`` backend's ``linear``; an FP8 weight over ≥ ``MIN_ROWS`` rows and ≥ ``MIN_LINEAR_WORK``
    multiply-adds runs W8A8."""
    rows = x.numel() // max(1, x.shape[-1])
    if (scale_inv is None or weight.dim() != 2 or rows < MIN_ROWS or rows * weight.numel() < MIN_LINEAR_WORK
            or not _quantized(x, weight)):
        return triton_linear.linear(x, weight, scale_inv)
    return w8a8_linear(x, weight, scale_inv)


@ops.register("moe_experts", backend="triton_w8a8", available=on_cuda)
def moe_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                gate_s: torch.Tensor | None, up_s: torch.Tensor | None, down_s: torch.Tensor | None,
                expert_offset: int = 0, shared: tuple | None = None, n_experts: int | None = None) -> torch.Tensor:
    """As the ``triton`` backend's ``moe_experts``; FP8 experts over ≥ ``MIN_ROWS`` rows run W8A8 (the shared
    expert through this backend's ``linear``)."""
    if gate_s is None or x.shape[0] < MIN_ROWS or gate.dim() != 3 or not _quantized(x, gate, up, down):
        return triton_moe.moe_experts(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset,
                                      shared, n_experts)
    out = w8a8_moe(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset)
    return out if shared is None else out + reference.swiglu(x, *shared, linear=linear)
